"""Side by side with kube-scheduler: one control plane, one simulated fleet, one run.

    python bench/compare_scheduler.py [--sizes 100,1000,5000] [--samples 200] [--burst 200] [--rounds 4]
                                      [--dra] [--quick] [--png PATH] [--json PATH] [--budget-s S]
                                      [--stall-ms MS]

Starts the full local plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler with its defaults, kwok), installs the CRDs and KubeVirt's CRD
fixtures (VirtualMachine, VMI), and runs the real controller (``cozygpu
controller --enable-gpu``) as its own process beside kube-scheduler: its
webhooks registered with the API server by URL on loopback HTTPS, its binder
leading; and the project's KubeVirt stand-in in a process of its own, as the
demo runs it (``cozygpu/devcluster/kubevirt.py``: a VMI's launcher pod
created, listed in ``status.activePods``, the VMI Running once kwok runs the
pod; ``--standin-in-process`` runs it in this process's loop instead). For each fleet
size N (ascending; the fleet grows between sizes) there are N kwok nodes with
8 units of one GPU resource name in allocatable, a GPUNode report of the same
8 per node, one GPUClass, and tenants with budgets far above what the run
orders. From the first node on, every node's report is rewritten at the real
agent's cadence (``agent_cadence.py``: each node once per the agent's
``--report-interval`` default of 2 min, spread evenly, so N/120 writes a
second, about 42/s at 5,000 nodes), throughout the growth and every timed
phase; the write rate achieved over each size's timing is printed. Measured
from this process, every latency on one monotonic clock, each through a
watch it holds open:

- floor: a ConfigMap created → its ADDED event seen (one write, one watch event);
- A, kube-scheduler: a pod requesting ``<resource>: 1`` created → ``spec.nodeName`` seen;
- B, the binder: a GPUDevice of count 1 created → ``status.phase: Bound`` seen;
- C, a VM start: a VMI naming a held device (one that B bound) created → the VMI
  seen with ``status.phase: Running`` (the stand-in writes Running only once
  its launcher pod runs: created by the stand-in, pinned by the pod webhook,
  placed by kube-scheduler, run by kwok), on the node its device is Bound on
  (checked after, untimed; a stopped hold may have moved since B bound it,
  which is counted and printed); and, from the same sample, "C-admit": the
  create → the API server's answer to it (webhook, bind request, the binder's
  answer, the mutation); and C's steps after that answer, through a watch of
  the launcher pods: → the stand-in's launcher pod created → placed
  (kube-scheduler's ``spec.nodeName``) → Running (kwok) → the VMI Running seen.

One at a time, in rounds that rotate the order (F A B C, A B C F, ...) so the
machine's noise falls on all four alike; then a burst of each (created at once),
timed until the last is bound / running. A's pods are deleted after each
phase: the binder counts pods asking for a GPU resource against the node's
units, as it must, so they would fill the fleet for B. Each VM C started is
stopped after its sample (after the burst, all of them), untimed: its VMI
deleted and waited for until gone, which the stand-in allows once its
launcher pod is gone. Printed: p50/p90/p99/max per figure per N, the ratios
B/A, C/A, C-admit/A and each to the floor, and how each grows with N.

The profile of B's answer path comes from the same run: the controller process
times its binder's passes where the binder calls them (snapshot, plan,
plan_writes, writes; when its cache first saw each order), on the same clock,
and each timed order is split into create → the binder's cache saw it →
waiting for its pass → snapshot → plan → status write → Bound seen here.

Client rate limits: kube-scheduler runs with its default client settings
(QPS 50, burst 100), which client-go applies per clientset: it has two, its
own and the one its events go through. cozygpu's client has no limiter of
its own, so the controller here runs with the same token bucket (50/s, burst
100) in front of each of its two clients: the replica's (cache, webhooks,
lease) and the fenced one its leader work writes through (binder, settings),
and one more for its Events, as kube-scheduler's have their own client.
``--no-qps-match`` runs it unlimited. Figures are printed, never
asserted; the machine is shared, so read ratios taken in the same run.
Beside the controller's event-loop lag, per size and over the same spans,
is a control's: a process on uvloop with nothing to do but the same 0.1 s
ticker, so what the machine alone (the plane, the bench, the controller
sharing its CPUs) makes a loop wait, which no work of the controller's
could remove. This process's own event-loop lag is printed too: every
figure is timed by a watch on this loop, so a late loop here is late for
every system alike. What it holds of the fleet is frozen after each growth
(``gc.freeze``), as the controller's caches are, so a full collection of
this process does not walk it in the middle of a timing. ``--stall-ms``
sets the shortest busy stretch of the controller's loop that is listed at
the end (its sampler's, default 20 ms; 0 runs the controller without the
sampler, whose thread takes the interpreter lock every 2 ms).

GPUs from a DRA driver (``--dra``; ``--quick`` includes it): every node also
gets 8 vfio GPUs published by the simulated NVIDIA DRA driver
(``cozygpu/devcluster/dra_driver.py``: the DeviceClass ``vfio.gpu.nvidia.com``
and one ResourceSlice per node, published as the fleet grows), one more
GPUClass sells them (``source.dra``), and two more systems join the rounds'
rotation and the bursts:

- A-DRA, kube-scheduler: a pod with its own ResourceClaim of the DeviceClass
  (from a ResourceClaimTemplate) created → ``spec.nodeName`` seen; in a
  namespace of its own that is no tenant's, deleted after each phase as A's
  pods are (their claims go with them, through the resourceclaim controller;
  the binder counts a claim's devices as taken, so they would fill the fleet);
- B-DRA, the binder: a GPUDevice of the DRA class created → ``status.phase:
  Bound`` seen, and → its hold claim (the ResourceClaim the binder's claims
  work creates in the device's namespace, named after it) seen allocated
  (``status.allocation``): two rows from one sample, "B-DRA binder (Bound)"
  and "B-DRA hold claim allocated", each with its ratio to A-DRA. The hold's
  path is split from the controller's pass records like B's: create → the
  claims pass that made its claim started → the claim created → its
  allocation written → seen here.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import collections
import contextlib
import gc
import json
import math
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.agent_cadence import AgentCadence  # noqa: E402
from bench.bench_binder import percentile, timed, timed_async  # noqa: E402
from bench.bench_cache import bounded  # noqa: E402
from cozygpu import keys  # noqa: E402
from cozygpu.kube import Client, errors, resource_path  # noqa: E402
from cozygpu.runtime.looplag import schedstat  # noqa: E402

RESOURCE = "nvidia.com/GH100_H100_SXM5_80GB"
#: The controller's event-loop lag histograms (``cozygpu/runtime/looplag.py``): how late its ticker woke, the
#: part of it the loop's thread waited for a CPU (the machine's other processes), and the rest, its own.
LAG = "cozygpu_event_loop_lag_seconds"
CPU_WAIT = "cozygpu_event_loop_cpu_wait_seconds"
BUSY_LAG = "cozygpu_event_loop_busy_lag_seconds"
#: How long each garbage collection held the controller, by generation (``cozygpu/runtime/gcpauses.py``).
GC = "cozygpu_gc_pause_seconds"
#: How often each read model (the binder's, the webhooks') was built again, by why.
REBUILDS = {"cozygpu_binder_read_model_rebuilds": "binder", "cozygpu_webhook_read_model_rebuilds": "webhooks"}
CLASS = "h100-compare"
UNITS = 8
TENANTS = 10
BENCH_LABEL = "bench.gpu.cozystack.io/compare"
CONTROLLER_NS = "cozy-gpu-compare"
PODS_NS = "compare-pods"
FLOOR_NS = "compare-floor"
#: kube-scheduler's default client (KubeSchedulerConfiguration clientConnection), applied to cozygpu too.
QPS, BURST = 50.0, 100
#: kwok renews each Lease every quarter of this (5,000 nodes at 600 s: ~33 writes/s).
NODE_LEASE_SECONDS = 600
SYSTEMS = ("floor", "A", "B", "C")
#: C's second figure, from the same sample: the VMI create → the API server's answer to it.
ADMIT = "C-admit"
#: With ``--dra``: two more systems in the rotation, and the hold's allocation, timed in B-DRA's samples.
DRA_SYSTEMS = ("A-DRA", "B-DRA")
HOLD = "B-DRA hold"
DRA_CLASS = "h100-compare-dra"
DRA_PODS_NS = "compare-dra-pods"
#: The ResourceClaimTemplate A-DRA's pods are made from (in ``DRA_PODS_NS``).
DRA_TEMPLATE = "vfio-gpu"
#: Where the controller leaves its binder's pass records (in the plane's directory).
RECORDS = "compare-binder-passes.json"
#: The lane of the binder's placement work (``binder.binder.PLACEMENT``); every other lane is housekeeping.
PLACEMENT = "placement"
#: C's steps, from the same sample, seen through a watch of the launcher pods: the answer → the stand-in's
#: launcher pod created → kube-scheduler's nodeName → kwok's Running → the VMI Running seen.
C_STEPS = ("C-launch", "C-place", "C-run", "C-seen")
LABELS = {"floor": "floor (ConfigMap → watch)", "A": "A kube-scheduler", "B": "B binder", "C": "C VM start",
          ADMIT: "C-admit: VMI create → admission answer",
          "C-launch": "C step: answer → launcher pod created", "C-place": "C step: → placed (kube-scheduler)",
          "C-run": "C step: → pod Running (kwok)", "C-seen": "C step: → VMI Running seen",
          "A-DRA": "A-DRA kube-scheduler (claim)", "B-DRA": "B-DRA binder (Bound)", HOLD: "B-DRA hold claim allocated"}
#: What one sample of a system times, when more than its own figure.
FIGURES = {"C": ("C", ADMIT, *C_STEPS), "B-DRA": ("B-DRA", HOLD)}
#: The ratios printed: each of the binder's figures over kube-scheduler's of the same kind.
RATIOS = (("B", "A"), ("C", "A"), (ADMIT, "A"), ("B-DRA", "A-DRA"), (HOLD, "A-DRA"))

NODES = resource_path("", "v1", "nodes")
GPUNODES = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)
ALL_DEVICES = resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL)
VALIDATING = resource_path("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
MUTATING = resource_path("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations")
RESOURCE_CLAIMS = resource_path("resource.k8s.io", "v1", "resourceclaims")
ALL_VMIS = resource_path("kubevirt.io", "v1", "virtualmachineinstances")
#: What one sample saw, by system (B-DRA's also the hold's): when it was sent and when its answer was seen.
Times = dict[str, tuple[float, float]]


def stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def nodes_to_score(n: int) -> tuple[int, int]:
    """kube-scheduler's default adaptive percentageOfNodesToScore at ``n`` nodes: (percent, nodes)."""
    if n < 100:
        return 100, n
    percent = max(5, 50 - n // 125)
    return percent, min(n, max(100, n * percent // 100))


# -- the controller, rate-limited like client-go (child process) ------------------------------


class TokenBucket:
    """client-go's default limiter: ``qps`` tokens a second, ``burst`` at most; a request waits for its token."""

    def __init__(self, qps: float, burst: int) -> None:
        self.rate, self.capacity = qps, float(burst)
        self.tokens, self.at = float(burst), time.monotonic()

    async def take(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= 1.0  # reserved now, waited for below (as rate.Limiter.Wait does)
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / self.rate)


def instrument(records: list[dict[str, Any]]) -> None:
    """Time the binder's passes where the binder calls them (module globals and methods: the bench's probes).

    Each pass of each work leaves one record: its lane, start and end; a
    placement pass also its snapshot, plan, plan_writes and writes, the
    devices it bound, and when the binder's cache first saw each of them; a
    claims pass the hold claims it created (or deallocated), when the
    server answered those writes and when it answered the allocations that
    follow them; one monotonic clock, the same as the bench's.
    """
    from cozygpu.binder import claims, cycle, housekeeping, place
    from cozygpu.binder.binder import Binder
    from cozygpu.binder.context import Context
    from cozygpu.model.placement import Answer, Bind

    current: dict[str, Any] = {}
    first_seen: dict[tuple[str, str], float] = {}

    # Module globals the binder calls, looked up by name: each is patched below.
    real_plan_pass, real_write_sets = getattr(cycle, "plan_pass"), getattr(place, "write_sets")  # noqa: B009
    real_allocations_after = getattr(claims, "allocations_after")  # noqa: B009

    def allocations_after(written: Any, *args: Any, **kw: Any) -> Any:
        written = list(written)  # the first writes the server took: a claim created (or deallocated) each
        current["claims_created"] = time.monotonic()
        current.setdefault("claim_keys", []).extend(
            "/".join(write.tag.device) for write, answer in written
            if answer is not None and hasattr(write.tag, "device"))
        return real_allocations_after(written, *args, **kw)

    def plan_pass(*args: Any, **kw: Any) -> Any:
        started = time.monotonic()
        plan = real_plan_pass(*args, **kw)
        current["plan"] = current.get("plan", 0.0) + time.monotonic() - started
        current.setdefault("binds", []).extend("/".join(a.device) for a in plan.actions if isinstance(a, Bind))
        current["answers"] = current.get("answers", 0) + sum(1 for a in plan.actions if isinstance(a, Answer))
        return plan

    async def write_sets(*args: Any, **kw: Any) -> Any:
        started = time.monotonic()
        current.setdefault("writes_started", started)
        try:
            return await real_write_sets(*args, **kw)
        finally:
            current["writes"] = current.get("writes", 0.0) + time.monotonic() - started

    real_send = Context.send

    async def send(self: Any, *args: Any, **kw: Any) -> Any:
        try:
            return await real_send(self, *args, **kw)
        finally:
            if current.get("lane") == "claims":  # its last: the allocations, on the versions the creates answered
                current["claims_answered"] = time.monotonic()

    def lane(name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def wrapper(self: Any, *args: Any, **kw: Any) -> Any:
            current.clear()
            current.update(lane=name, started=time.monotonic())
            try:
                return await fn(self, *args, **kw)
            finally:
                current["ended"] = time.monotonic()
                current["saw"] = {key: first_seen[tuple(key.split("/", 1))] for key in current.get("binds", ())
                                  if tuple(key.split("/", 1)) in first_seen}
                records.append(dict(current))
        return wrapper

    real_changed = Binder._device_changed

    def device_changed(self: Any, event: Any) -> None:
        if event.old is None and event.type != "DELETED":
            meta = event.obj.get("metadata") or {}
            first_seen.setdefault((meta.get("namespace", ""), meta.get("name", "")), time.monotonic())
        real_changed(self, event)

    setattr(cycle, "plan_pass", plan_pass)  # noqa: B010
    setattr(place, "plan_writes", timed(current, "plan_writes", getattr(place, "plan_writes")))  # noqa: B009,B010
    setattr(place, "write_sets", write_sets)  # noqa: B010
    setattr(claims, "allocations_after", allocations_after)  # noqa: B010
    setattr(Context, "snapshot", timed_async(current, "snapshot", Context.snapshot))  # noqa: B010
    setattr(Context, "send", send)  # noqa: B010
    works: dict[str, Any] = {PLACEMENT: place.PlacementWork, "claims": housekeeping.ClaimsWork,
                              "attachments": housekeeping.AttachmentsWork,
                              "finalizers": housekeeping.FinalizersWork, "usage": housekeeping.UsageWork,
                              "reports": housekeeping.ReportsWork, "verify": housekeeping.VerifyWork}
    for name, work in works.items():
        setattr(work, "run", lane(name, work.run))  # noqa: B010
    setattr(Binder, "_device_changed", device_changed)  # noqa: B010


def request_kind(method: str, path: str) -> str:
    """``PATCH gpudevices/status``: a request's verb and resource, without namespace and name."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) > 2 and rest[0] == "namespaces":
        rest = rest[2:]
    resource = rest[0] if rest else "-"
    if len(rest) > 2:
        resource += "/" + rest[2]
    return f"{method} {resource}"


class StallProbe:
    """Where the controller's event loop was busy for long stretches: a thread samples the main thread's
    Python stack every ``every`` seconds; samples in a row with Python frames on it (the loop running
    callbacks, not waiting in its poll) make a busy stretch, and each stretch of ``at_least`` seconds is
    kept with the cozygpu function seen most in it (the innermost cozygpu frame of each sample), how many
    samples it took, and how long the main thread waited for a CPU in it (the kernel's run-queue wait, where
    Linux tells). A gap of over five sampling intervals (the probe itself not running) ends a stretch: it is
    not known to be busy."""

    def __init__(self, every: float = 0.002, at_least: float = 0.02) -> None:
        import threading

        self.every, self.at_least = every, at_least
        self.stalls: list[dict[str, Any]] = []
        self._main = threading.main_thread().ident or 0
        self._main_tid = threading.main_thread().native_id or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=1)
        return self.stalls

    @staticmethod
    def _where(frame: Any) -> str | None:
        """The innermost frame in the cozygpu package, or None when the loop waits in its poll (the innermost
        Python frame is then the runner's: uvloop's ``run_until_complete`` is C)."""
        if frame.f_code.co_filename.endswith(("asyncio/runners.py", "uvloop/__init__.py")):
            return None
        innermost = f"{'/'.join(frame.f_code.co_filename.rsplit('/', 2)[-2:])}:{frame.f_code.co_name}"
        while frame is not None:
            name = frame.f_code.co_filename
            if "/cozygpu/" in name and not name.endswith(("runtime/command.py", "cozygpu/cli.py")):
                return f"{name.rsplit('/cozygpu/', 1)[1]}:{frame.f_code.co_name}"
            frame = frame.f_back
        return f"(outside cozygpu: {innermost})"

    def _waited(self) -> float:
        """The main thread's run-queue wait so far, in seconds (0 where the kernel does not tell)."""
        return task_times(os.getpid(), self._main_tid)[1]

    def _run(self) -> None:
        started, waited, last, seen = 0.0, 0.0, 0.0, collections.Counter[str]()

        def close(at: float) -> None:
            nonlocal started, seen
            if started and at - started >= self.at_least:
                self.stalls.append({"at": started, "seconds": at - started, "where": seen.most_common(3),
                                    "samples": sum(seen.values()), "cpu_wait": self._waited() - waited})
            started, seen = 0.0, collections.Counter()

        while not self._stop.wait(self.every):
            frame = sys._current_frames().get(self._main)
            where = self._where(frame) if frame is not None else None
            now = time.monotonic()
            if started and now - last > 5 * self.every:
                # The probe itself did not run meanwhile (it waited for a CPU or for the interpreter): what the
                # loop did in the gap is unknown, so the stretch ends at the last sample that saw it busy.
                close(last)
            last = now
            if where is not None:
                if not started:
                    started, waited = now, self._waited()
                seen[where] += 1
                continue
            close(now)


def run_idle_loop(port: int) -> None:
    """A control beside the controller: a process on uvloop with nothing to do but the same lag ticker
    (``LoopLag``), its histograms served on loopback. Its lag is what the machine alone makes a loop wait:
    the share of the controller's lag that no work of the controller's could remove."""
    import uvloop
    from aiohttp import web
    from prometheus_client import CollectorRegistry, generate_latest

    from cozygpu.runtime.looplag import LoopLag

    registry = CollectorRegistry()
    ticker = LoopLag(registry)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await ticker.run()

    uvloop.run(serve())


async def start_idle_loop(plane: Any) -> tuple[asyncio.subprocess.Process, str]:
    """The idle control (``run_idle_loop``) as a process of its own, and its metrics URL once it answers."""
    import aiohttp

    from cozygpu.devcluster.plane import free_port

    port = free_port()
    log = (plane.directory / "logs" / "idle-loop.log").open("ab")
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--idle-loop", str(port), stdin=asyncio.subprocess.DEVNULL, stdout=log,
        stderr=log, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/metrics"
    async with asyncio.timeout(60), aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return process, url
            await asyncio.sleep(0.2)


async def idle_metrics(url: str) -> dict[str, float]:
    """The idle control's lag histograms now."""
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return values_of(await resp.text())


def run_controller(argv: list[str], *, qps: float | None, records_path: str, stall_s: float) -> int:
    from cozygpu import cli

    buckets: dict[object, TokenBucket] = {}
    original = Client._once
    #: Requests the controller sent, by verb and resource, with the phase they were sent in.
    requests: dict[str, int] = {}
    started = time.monotonic()

    async def limited(self: Client, method: str, path: str, *args: Any, **kw: Any) -> Any:
        kind = request_kind(method, path)
        requests[kind] = requests.get(kind, 0) + 1
        if qps is not None:
            # One bucket per Client object, as client-go gives one to each clientset made from a config
            # (they share connections, not limiters): kube-scheduler has its own and its event client's;
            # the controller has the replica's (cache, webhooks, lease) and its leader work's (fenced), and
            # its Events get a bucket of their own, as kube-scheduler's go through their own client.
            owner = "events" if kind == "POST events" else id(self)
            bucket = buckets.setdefault(owner, TokenBucket(qps, BURST))
            await bucket.take()
        return await original(self, method, path, *args, **kw)

    setattr(Client, "_once", limited)  # noqa: B010 - the bench's limiter and count, nothing else
    records: list[dict[str, Any]] = []
    instrument(records)
    probe = StallProbe(at_least=stall_s) if stall_s > 0 else None
    if probe is not None:
        probe.start()
    try:
        return cli.main(argv)
    finally:
        Path(records_path).with_suffix(".stalls.json").write_text(json.dumps(probe.stop() if probe else []))
        Path(records_path).write_text(json.dumps(records))
        Path(records_path).with_suffix(".requests.json").write_text(json.dumps(
            {"seconds": time.monotonic() - started, "requests": requests}))


# -- watching (this process) ---------------------------------------------------------------------


class Seen:
    """One watch of one collection; a future per expected key, resolved when ``done(obj)`` first holds (with
    ``keep``, that object is left in ``found`` under its key, for the caller to take)."""

    def __init__(self, client: Client, path: str, done: Callable[[dict[str, Any]], bool],
                 params: dict[str, str] | None = None, *, keep: bool = False,
                 on_event: Callable[[dict[str, Any], float], None] | None = None) -> None:
        self.client, self.path, self.done, self.params, self.keep = client, path, done, params or {}, keep
        #: Told every object the watch delivers, with when it was seen.
        self.on_event = on_event
        self.waiting: dict[tuple[str, str], asyncio.Future[float]] = {}
        self.found: dict[tuple[str, str], dict[str, Any]] = {}
        self.synced = asyncio.Event()
        #: The keys that exist, from the events since the watch started (the collection starts empty).
        self.live: set[tuple[str, str]] = set()
        self.changed = asyncio.Event()

    def expect(self, namespace: str, name: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[(namespace, name)] = future
        return future

    async def run(self) -> None:
        version = ""
        while True:
            if not version:
                listed = await self.client.list_objects(self.path, params={**self.params, "limit": 1})
                version = str(listed["metadata"]["resourceVersion"])
                self.synced.set()
            try:
                async for event in self.client.watch(self.path, params={
                        **self.params, "resourceVersion": version, "allowWatchBookmarks": "true"}):
                    now = time.monotonic()
                    obj = event.get("object") or {}
                    meta = obj.get("metadata") or {}
                    version = str(meta.get("resourceVersion") or version)
                    if event.get("type") == "BOOKMARK":
                        continue
                    key = (meta.get("namespace", ""), meta.get("name", ""))
                    if event.get("type") == "DELETED":
                        self.live.discard(key)
                    else:
                        self.live.add(key)
                    self.changed.set()
                    if self.on_event is not None:
                        self.on_event(obj, now)
                    future = self.waiting.get(key)
                    if future is not None and not future.done() and self.done(obj):
                        if self.keep:
                            self.found[key] = obj
                        future.set_result(now)
                        del self.waiting[key]
            except errors.Gone:
                version = ""
            except errors.Unavailable:
                await asyncio.sleep(0.1)


def pod_bound(obj: dict[str, Any]) -> bool:
    return bool((obj.get("spec") or {}).get("nodeName"))


def device_bound(obj: dict[str, Any]) -> bool:
    return (obj.get("status") or {}).get("phase") == "Bound"


def claim_allocated(obj: dict[str, Any]) -> bool:
    return bool((obj.get("status") or {}).get("allocation"))


def vmi_running(obj: dict[str, Any]) -> bool:
    """The stand-in's Running: written once the VMI's launcher pod runs on ``status.nodeName`` (the only pod
    in ``activePods``, on that node)."""
    status = obj.get("status") or {}
    node = status.get("nodeName")
    return status.get("phase") == "Running" and bool(node) and list((status.get("activePods") or {}).values()) == [node]


# -- the world -----------------------------------------------------------------------------------


class Bench:
    def __init__(self, admin: Client, burst_clients: list[Client], args: argparse.Namespace, *,
                 reports: Client) -> None:
        self.admin, self.burst_clients, self.args = admin, burst_clients, args
        self.tag = uuid.uuid4().hex[:5]
        self.counter = 0
        self.nodes: list[str] = []
        #: Every node's agent report at the real agent's cadence, through a client of its own (``run()`` it).
        self.reports = AgentCadence(reports, lambda: self.nodes, self.report_body)
        self.held: list[tuple[str, str, str]] = []  # devices B bound, not yet started by C: key and node
        self.started: list[tuple[str, str]] = []  # VMIs C created, not yet stopped
        #: C's starts whose hold was no longer on the node B saw it Bound on (a stopped hold the binder moved).
        self.moved = 0
        #: Every order B timed: its key, sent, seen and phase ("N one", "N burst", "" untimed).
        self.orders: list[dict[str, Any]] = []
        self.phase = ""
        self.floor = Seen(admin, resource_path("", "v1", "configmaps", namespace=FLOOR_NS), lambda _: True)
        self.pods = Seen(admin, resource_path("", "v1", "pods", namespace=PODS_NS), pod_bound)
        self.devices = Seen(admin, ALL_DEVICES, device_bound, {"labelSelector": f"{BENCH_LABEL}=order"}, keep=True)
        self.vmis = Seen(admin, ALL_VMIS, vmi_running, keep=True)
        #: (namespace, VMI) -> when its launcher pod was first seen created, placed and Running (C's steps).
        self.launched: dict[tuple[str, str], dict[str, float]] = {}
        self.launchers = Seen(admin, resource_path("", "v1", "pods"), lambda _: False,
                              {"labelSelector": f"{keys.KUBEVIRT_LAUNCHER_LABEL}={keys.KUBEVIRT_LAUNCHER_VALUE}"},
                              on_event=self.launcher_seen)
        self.dra = bool(getattr(args, "dra", False))
        #: The systems of the rounds' rotation and the bursts, and every figure they time (B-DRA's: two).
        self.systems = SYSTEMS + (DRA_SYSTEMS if self.dra else ())
        self.measured = tuple(key for system in self.systems for key in FIGURES.get(system, (system,)))
        self.dra_pods = Seen(admin, resource_path("", "v1", "pods", namespace=DRA_PODS_NS), pod_bound)
        #: Every ResourceClaim: the holds (in the tenants' namespaces) and A-DRA's pods' own.
        self.claims = Seen(admin, RESOURCE_CLAIMS, claim_allocated)

    def watches(self) -> list[Seen]:
        return [self.floor, self.pods, self.devices, self.vmis, self.launchers] + (
            [self.dra_pods, self.claims] if self.dra else [])

    def launcher_seen(self, pod: dict[str, Any], now: float) -> None:
        """Note when a launcher pod was first seen created, placed and Running, by the VMI it launches."""
        meta = pod.get("metadata") or {}
        vmi = next((ref.get("name") for ref in meta.get("ownerReferences") or ()
                    if ref.get("kind") == "VirtualMachineInstance"), None)
        if vmi is None:
            return
        times = self.launched.setdefault((meta.get("namespace", ""), vmi), {})
        times.setdefault("created", now)
        if (pod.get("spec") or {}).get("nodeName"):
            times.setdefault("placed", now)
        if (pod.get("status") or {}).get("phase") == "Running":
            times.setdefault("running", now)

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.tag}-{self.counter}"

    def tenant(self) -> str:
        return f"tenant-cmp{self.counter % TENANTS}"

    async def setup(self) -> None:
        from cozygpu.devcluster import dra_driver

        namespaces = resource_path("", "v1", "namespaces")
        for ns, labels in [(CONTROLLER_NS, {}), (PODS_NS, {}), (FLOOR_NS, {}),
                           *([(DRA_PODS_NS, {})] if self.dra else []),
                           *[(f"tenant-cmp{i}", {BENCH_LABEL: "tenant"}) for i in range(TENANTS)]]:
            await self.admin.create(namespaces, {"metadata": {"name": ns, "labels": labels}})
        budgets = {f"requests.{keys.class_quota_key(name)}": "100000"
                   for name in (CLASS, *([DRA_CLASS] if self.dra else []))}
        for i in range(TENANTS):
            await self.admin.create(resource_path("", "v1", "resourcequotas", namespace=f"tenant-cmp{i}"), {
                "metadata": {"name": "tenant-quota"}, "spec": {"hard": budgets}})
        classes = resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL)
        h100 = {"vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "memory": "80Gi"}
        await self.admin.create(classes, {
            "apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND, "metadata": {"name": CLASS},
            "spec": {**h100, "resourceName": RESOURCE, "source": {"devicePlugin": {}}}})
        if not self.dra:
            return
        await dra_driver.ensure_device_class(self.admin)
        await self.admin.create(classes, {
            "apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND, "metadata": {"name": DRA_CLASS},
            "spec": {**h100, "resourceName": f"deviceclass.resource.kubernetes.io/{dra_driver.DEVICE_CLASS}",
                     "source": {"dra": {"deviceClassName": dra_driver.DEVICE_CLASS}}}})
        await self.admin.create(
            resource_path("resource.k8s.io", "v1", "resourceclaimtemplates", namespace=DRA_PODS_NS),
            {"metadata": {"name": DRA_TEMPLATE}, "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": dra_driver.DEVICE_CLASS}}]}}}})

    async def grow(self, n: int) -> float:
        """Add kwok nodes (8 units each) and their GPUNode reports (with ``--dra`` also a ResourceSlice of 8 vfio
        GPUs each) until the fleet has ``n``, and wait for the binder's first report on each; seconds taken."""
        from cozygpu.devcluster import nodes

        started = time.monotonic()
        new = [f"cmp-node-{i:05d}" for i in range(len(self.nodes), n)]
        await nodes.add_nodes(self.admin, [nodes.SimNode(name, {RESOURCE: UNITS}) for name in new])

        async def report(name: str) -> None:
            await self.admin.create(GPUNODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                                               "metadata": {"name": name}})
            await self.admin.merge_patch(f"{GPUNODES}/{name}/status", {"status": self.report_body()})

        await bounded(report(name) for name in new)
        if self.dra:
            from cozygpu.devcluster import dra_driver

            published = time.monotonic()
            await dra_driver.publish(self.admin, dict.fromkeys(new, UNITS))
            print(f"    DRA: {UNITS} vfio GPUs published on each of {len(new)} new nodes (a ResourceSlice each)"
                  f" in {time.monotonic() - published:.1f}s", flush=True)
        self.nodes += new
        await nodes.wait_ready(self.admin, self.nodes, timeout=600)
        await self.reported(timeout=900)
        return time.monotonic() - started

    async def reported(self, *, timeout: float) -> None:
        """Until the binder has written its first report (conditions) on every GPUNode of the fleet."""
        async with asyncio.timeout(timeout):
            while True:
                listed = await self.admin.list_objects(GPUNODES)
                mine = set(self.nodes)
                done = sum(1 for item in listed["items"] if item["metadata"]["name"] in mine
                           and (item.get("status") or {}).get("conditions"))
                if done == len(mine):
                    return
                await asyncio.sleep(2.0)

    def report_body(self) -> dict[str, Any]:
        devices = [{"address": f"0000:{d + 1:02x}:00.0", "resourceName": RESOURCE, "allocatable": 1,
                    "driver": "vfio-pci"} for d in range(UNITS)]
        return {"devices": devices, "resourceNames": [RESOURCE], "agent": {"lastReport": stamp()}}

    async def frozen(self, controller: asyncio.subprocess.Process, count: int) -> dict[str, list[float]]:
        """Floor and A again with the controller frozen (SIGSTOP, for a few seconds): what it costs them."""
        figures: dict[str, list[float]] = {"floor": [], "A": []}
        controller.send_signal(signal.SIGSTOP)
        try:
            for _ in range(count):
                for system in figures:
                    figures[system].append(await self.one(system)(self.admin) * 1000)
        finally:
            controller.send_signal(signal.SIGCONT)
        return figures

    async def clear_pods(self) -> None:
        """A's pods deleted (kwok removes them): the binder counts them against the nodes' units too; and
        A-DRA's, with their claims (the resourceclaim controller deletes a pod's own claim once it is gone):
        the binder counts a claim's devices as taken."""
        await self.admin.delete(resource_path("", "v1", "pods", namespace=PODS_NS))
        if self.dra:
            await self.admin.delete(resource_path("", "v1", "pods", namespace=DRA_PODS_NS))

        def left(seen: Seen) -> bool:
            return any(namespace in (PODS_NS, DRA_PODS_NS) for namespace, _ in seen.live)

        async with asyncio.timeout(300):
            for seen in (self.pods, self.dra_pods, self.claims):  # the claims: A-DRA's, not the holds
                while left(seen):
                    seen.changed.clear()
                    await seen.changed.wait()
        await asyncio.sleep(2.0)  # the binder's passes over the deletions, before any timing

    async def stop_vms(self) -> None:
        """The VMs C started, stopped (untimed): each VMI deleted, then waited for until it is gone, which the
        stand-in allows once its launcher pod is gone (virt-controller's finalizer), so the launchers' units
        are free for the next sample."""
        started, self.started = self.started, []
        if not started:
            return

        async def stop(namespace: str, name: str) -> None:
            with contextlib.suppress(errors.NotFound):
                await self.admin.delete(resource_path("kubevirt.io", "v1", "virtualmachineinstances",
                                                      namespace=namespace, name=name))

        await bounded((stop(namespace, name) for namespace, name in started), concurrency=16)
        async with asyncio.timeout(300):
            while any(key in self.vmis.live for key in started):
                self.vmis.changed.clear()
                await self.vmis.changed.wait()

    # -- one sample of each ------------------------------------------------------------------------

    def floor_body(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "data": {"k": "v"}}

    def pod_body(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {
            "containers": [{"name": "c", "image": "compare.invalid/c",
                            "resources": {"requests": {RESOURCE: "1"}, "limits": {RESOURCE: "1"}}}]}}

    def order_body(self, name: str, gpu_class: str = CLASS) -> dict[str, Any]:
        return {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                "metadata": {"name": name, "labels": {BENCH_LABEL: "order"}},
                "spec": {"className": gpu_class, "count": 1}}

    def dra_pod_body(self, name: str) -> dict[str, Any]:
        """A pod with a claim of its own of the vfio DeviceClass, made from the template (``DRA_TEMPLATE``)."""
        container = {"name": "c", "image": "compare.invalid/c", "resources": {"claims": [{"name": "gpu"}]}}
        return {"metadata": {"name": name}, "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": DRA_TEMPLATE}],
            "containers": [container]}}

    async def floor_one(self, client: Client) -> Times:
        name = self.name("cm")
        seen = self.floor.expect(FLOOR_NS, name)
        sent = time.monotonic()
        await client.create(resource_path("", "v1", "configmaps", namespace=FLOOR_NS), self.floor_body(name))
        return {"floor": (sent, await asyncio.wait_for(seen, 120))}

    async def a_one(self, client: Client) -> Times:
        name = self.name("pod")
        seen = self.pods.expect(PODS_NS, name)
        sent = time.monotonic()
        await client.create(resource_path("", "v1", "pods", namespace=PODS_NS), self.pod_body(name))
        return {"A": (sent, await asyncio.wait_for(seen, 120))}

    async def b_one(self, client: Client) -> Times:
        name, namespace = self.name("gpu"), self.tenant()
        seen = self.devices.expect(namespace, name)
        sent = time.monotonic()
        await client.create(resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace),
                            self.order_body(name))
        at = await asyncio.wait_for(seen, 120)
        bound = self.devices.found.pop((namespace, name))
        self.held.append((namespace, name, str((bound.get("status") or {}).get("nodeName") or "")))
        self.orders.append({"key": f"{namespace}/{name}", "sent": sent, "seen": at, "phase": self.phase})
        return {"B": (sent, at)}

    async def c_one(self, client: Client) -> Times:
        """A VM start on a held device: the VMI Running on the device's node seen, and the create's answer."""
        from tests.admission.harness import vmi_body

        namespace, device, node = self.held.pop(0)
        name = self.name("vm")
        running = self.vmis.expect(namespace, name)
        sent = time.monotonic()
        made = await client.create(resource_path("kubevirt.io", "v1", "virtualmachineinstances", namespace=namespace),
                                   vmi_body(name, [{"device": device}]))
        answered = time.monotonic()
        self.started.append((namespace, name))
        if not (made.get("spec") or {}).get("domain", {}).get("devices", {}).get("gpus"):
            raise SystemExit(f"VMI {namespace}/{name} was admitted without its GPU: {made.get('spec')}")
        at = await asyncio.wait_for(running, 120)
        ran_on = (self.vmis.found.pop((namespace, name)).get("status") or {}).get("nodeName")
        # Where the hold is now (untimed): a running VM's hold stays put (R-BIND-7), but while it was stopped
        # the binder may have moved it (pods kube-scheduler placed on its node take the units first).
        held = await self.admin.get(resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL,
                                                  namespace=namespace, name=device))
        held_on = (held.get("status") or {}).get("nodeName")
        if ran_on != held_on:
            raise SystemExit(f"VMI {namespace}/{name} runs on {ran_on}, not on {held_on}, where GPUDevice"
                             f" {namespace}/{device} is Bound")
        if held_on != node:
            self.moved += 1
        launched = self.launched.pop((namespace, name), {})
        created = launched.get("created", answered)
        placed = launched.get("placed", created)
        running = launched.get("running", placed)
        return {"C": (sent, at), ADMIT: (sent, answered), "C-launch": (answered, created), "C-place": (created, placed),
                "C-run": (placed, running), "C-seen": (running, at)}

    async def a_dra_one(self, client: Client) -> Times:
        name = self.name("dra-pod")
        seen = self.dra_pods.expect(DRA_PODS_NS, name)
        sent = time.monotonic()
        await client.create(resource_path("", "v1", "pods", namespace=DRA_PODS_NS), self.dra_pod_body(name))
        return {"A-DRA": (sent, await asyncio.wait_for(seen, 120))}

    async def b_dra_one(self, client: Client) -> Times:
        """A GPUDevice of the DRA class: Bound seen, then its hold claim (same key) seen allocated."""
        name, namespace = self.name("dra-gpu"), self.tenant()
        bound, held = self.devices.expect(namespace, name), self.claims.expect(namespace, name)
        sent = time.monotonic()
        await client.create(resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace),
                            self.order_body(name, DRA_CLASS))
        bound_at = await asyncio.wait_for(bound, 120)
        self.devices.found.pop((namespace, name), None)
        held_at = await asyncio.wait_for(held, 120)
        self.orders.append({"key": f"{namespace}/{name}", "sent": sent, "seen": bound_at, "held": held_at,
                            "phase": self.phase, "dra": True})
        return {"B-DRA": (sent, bound_at), HOLD: (sent, held_at)}

    def sample(self, system: str) -> Callable[[Client], Awaitable[Times]]:
        """One sample of ``system``: when each of its figures was sent and seen (``FIGURES``: C's and B-DRA's two)."""
        return {"floor": self.floor_one, "A": self.a_one, "B": self.b_one, "C": self.c_one,
                "A-DRA": self.a_dra_one, "B-DRA": self.b_dra_one}[system]

    def one(self, system: str) -> Callable[[Client], Awaitable[float]]:
        """One sample of ``system``: its latency, s."""
        async def latency(client: Client) -> float:
            sent, seen = (await self.sample(system)(client))[system]
            return seen - sent
        return latency

    async def rounds(self, samples: int, rounds: int) -> dict[str, list[float]]:
        figures: dict[str, list[float]] = {s: [] for s in self.measured}
        per_round = [samples // rounds + (1 if r < samples % rounds else 0) for r in range(rounds)]
        systems = self.systems
        for r, count in enumerate(per_round):
            if len(self.held) < count:  # C may come before B this round: devices to start, bound untimed
                await asyncio.gather(*(self.b_one(self.admin) for _ in range(count - len(self.held))))
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            for system in order:
                for _ in range(count):
                    for key, (sent, seen) in (await self.sample(system)(self.admin)).items():
                        figures[key].append((seen - sent) * 1000)
                    await self.stop_vms()
            print(f"    round {r + 1}/{rounds} ({' '.join(order)}): " + ", ".join(
                f"{s} p50 {statistics.median(figures[s]):.1f}" for s in self.measured) + f" ms; {load()}", flush=True)
        return figures

    async def burst(self, system: str, count: int) -> dict[str, dict[str, Any]]:
        """``count`` created at once (spread over several connection pools); for each figure the system
        times (``FIGURES``), each latency and the wall time until the last. C's VMs are stopped after."""
        await asyncio.sleep(1.0)  # the last phase's aftermath (the binder's passes over it), before any timing
        clients = self.burst_clients
        started = time.monotonic()
        answers = await asyncio.gather(*(self.sample(system)(clients[i % len(clients)]) for i in range(count)),
                                       return_exceptions=True)
        ended = time.monotonic()
        await self.stop_vms()
        refused = [a for a in answers if isinstance(a, errors.ApiError)]
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, errors.ApiError):
                raise answer
        out: dict[str, dict[str, Any]] = {}
        for key in FIGURES.get(system, (system,)):
            times = [a[key] for a in answers if isinstance(a, dict)]
            last = ended if refused or not times else max(seen for _, seen in times)  # a refusal: its answer too
            out[key] = {"latencies": [(seen - sent) * 1000 for sent, seen in times], "wall_ms": (last - started) * 1000,
                        "refused": len(refused), "why": sorted({_reason(a) for a in refused})}
        return out


def _reason(error: errors.ApiError) -> str:
    """A refusal's status and reason, without the object's name."""
    return f"{error.status} {error.reason}" + (" (no answer from the binder)" if "no answer" in error.message else "")


# -- the run -------------------------------------------------------------------------------------


async def metrics_of(target: tuple[str, str]) -> dict[str, float]:
    """The controller's admission and binder latency sums and counts, from its /metrics: ``target`` is its
    HTTPS URL and a bearer token allowed ``get`` on it (the controller's self-signed certificate is not
    verified, as the chart's ServiceMonitor does by default)."""
    import aiohttp

    url, token = target
    async with aiohttp.ClientSession() as session, \
            session.get(url, headers={"Authorization": f"Bearer {token}"}, ssl=False) as resp:
        if resp.status != 200:
            raise SystemExit(f"the controller's {url} answered {resp.status}: {await resp.text()}")
        return values_of(await resp.text())


def values_of(text: str) -> dict[str, float]:
    """The figures this bench reads of an exposition: the lag histograms' buckets, the rebuilds, and the sums
    and counts of the admission, binder and collector histograms."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"cozygpu_admission_duration_seconds", "cozygpu_admission_bind_wait_seconds",
              "cozygpu_binder_answer_latency_seconds", GC}
    # Only these families' lines reach the parser: it reads 20,000 per-node series at 5,000 nodes in about
    # 0.6 s, on this loop, which times every figure.
    names = (*wanted, LAG, CPU_WAIT, BUSY_LAG, *REBUILDS)
    prefixes = (*names, *(f"# {kind} {name}" for kind in ("HELP", "TYPE") for name in names))
    text = "\n".join(line for line in text.splitlines() if line.startswith(prefixes))
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (LAG, CPU_WAIT, BUSY_LAG):
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    out[f"{family.name}_bucket{{le={sample.labels['le']}}}"] = sample.value
            continue
        if family.name in REBUILDS:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[f"{family.name}{{{sample.labels.get('reason', '')}}}"] = sample.value
            continue
        if family.name not in wanted:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count")):
                label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{label}}}"] = out.get(f"{sample.name}{{{label}}}", 0.0) + sample.value
    return out


def loop_lag(*spans: tuple[dict[str, float], dict[str, float]], family: str = LAG) -> dict[str, float]:
    """One of the controller's event-loop lag histograms over spans, each between two scrapes (its ticker
    wakes every 0.1 s): how many wake-ups, and the bucket bounds (ms) under which 99 % and all of them fell."""
    prefix = f"{family}_bucket{{le="
    counts: dict[float, float] = {}
    for before, after in spans:
        for key in after:
            if key.startswith(prefix):
                bound = float(key[len(prefix):-1])
                counts[bound] = counts.get(bound, 0.0) + after[key] - before.get(key, 0.0)
    bounds = sorted(counts.items())
    total = bounds[-1][1] if bounds else 0.0
    if total <= 0:
        return {"ticks": 0.0, "p99_ms": math.nan, "max_ms": math.nan}

    def under(share: float) -> float:
        return next(bound for bound, count in bounds if count >= share * total) * 1000

    return {"ticks": total, "p99_ms": under(0.99), "max_ms": under(1.0)}


def task_times(pid: int, tid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds ready but waiting for one) of thread ``tid`` of process ``pid`` (the kernel's
    counters; zeros where it keeps none)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as stats:
            return schedstat(stats.read())
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0


def thread_times(pid: int) -> tuple[float, float, float]:
    """(now, seconds on a CPU, seconds ready but waiting for one) of process ``pid``'s main thread, the one its
    event loop runs on."""
    return (time.monotonic(), *task_times(pid, pid))


def thread_share(*spans: tuple[tuple[float, float, float], tuple[float, float, float]]) -> str:
    """What the loop's thread did over spans of ``thread_times`` readings, in words."""
    wall = sum(b[0] - a[0] for a, b in spans)
    on_cpu = sum(b[1] - a[1] for a, b in spans)
    waiting = sum(b[2] - a[2] for a, b in spans)
    return (f"{wall:.0f} s: on a CPU {on_cpu:.1f} s ({on_cpu / max(wall, 1e-9):.0%}), ready but waiting for a CPU "
            f"{waiting:.1f} s ({waiting / max(wall, 1e-9):.0%})")


def said(figures: dict[str, float]) -> str:
    """A ``loop_lag`` result in words."""
    return (f"{figures['ticks']:.0f} wake-ups, p99 under {figures['p99_ms']:g} ms, "
            f"max under {figures['max_ms']:g} ms")


def rebuilds(before: dict[str, float], after: dict[str, float]) -> str:
    """The read models' rebuilds between two scrapes, by model and why."""
    said = []
    for family, model in REBUILDS.items():
        moved = {key[len(family) + 1:-1]: after[key] - before.get(key, 0.0) for key in after
                 if key.startswith(f"{family}{{")}
        reasons = ", ".join(f"{why} {count:.0f}" for why, count in sorted(moved.items()) if count)
        said.append(f"{model}: {reasons or 'none'}")
    return "; ".join(said)


def gc_pauses(*spans: tuple[dict[str, float], dict[str, float]]) -> str:
    """The controller's garbage collections over spans: how many of each generation and their seconds."""
    counts: dict[str, list[float]] = {}
    for before, after in spans:
        for key, value in after.items():
            if key.startswith(f"{GC}_count{{generation="):
                generation = key[len(f"{GC}_count{{generation="):-1]
                total = key.replace("_count{", "_sum{")
                moved = counts.setdefault(generation, [0.0, 0.0])
                moved[0] += value - before.get(key, 0.0)
                moved[1] += after.get(total, 0.0) - before.get(total, 0.0)
    return ", ".join(f"gen {g}: {n:.0f} in {t:.2f} s" for g, (n, t) in sorted(counts.items()) if n) or "none"


def shares(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean ms per call of each histogram between two scrapes."""
    out: dict[str, float] = {}
    for key, value in after.items():
        if "_sum{" not in key:
            continue
        count_key = key.replace("_sum{", "_count{")
        calls = after.get(count_key, 0.0) - before.get(count_key, 0.0)
        if calls > 0:
            out[key.replace("_sum", "") + f" n={calls:.0f}"] = (value - before.get(key, 0.0)) / calls * 1000
    return out


async def start_controller(plane: Any, admin: Client, args: argparse.Namespace
                           ) -> tuple[asyncio.subprocess.Process, str, tuple[str, str]]:
    """The controller, its webhook URL, and its metrics URL with a token allowed to scrape it."""
    from cozygpu.devcluster import pki, replicas
    from cozygpu.devcluster.plane import free_port

    cert_dir = plane.directory / "compare-webhook"
    cert_dir.mkdir(exist_ok=True)
    pki.issue(pki.KeyPair(plane.pki_dir / "serving-ca.crt", plane.pki_dir / "serving-ca.key"), cert_dir, "tls",
              common_name="cozygpu-webhook", hosts=("127.0.0.1",), server=True)
    webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
    argv = ["controller", "--kubeconfig", str(plane.kubeconfig), "--namespace", CONTROLLER_NS, "--enable-gpu",
            "--cert-dir", str(cert_dir),
            "--webhook-addr", f"127.0.0.1:{webhook_port}", "--health-addr", f"127.0.0.1:{health_port}",
            "--metrics-addr", f"127.0.0.1:{metrics_port}", "--identity", "compare-bench",
            "--log-format", "text", "--log-level", args.controller_log_level]
    log = (plane.directory / "logs" / "cozygpu-controller.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--controller", json.dumps(argv), "--records", str(plane.directory / RECORDS),
        *(["--no-qps-match"] if args.no_qps_match else []), "--stall-ms", str(args.stall_ms),
        stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT)
    import aiohttp

    async with asyncio.timeout(300), aiohttp.ClientSession() as session:
        while True:
            if process.returncode is not None:
                raise SystemExit("the controller exited; see logs/cozygpu-controller.log in the plane directory")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{health_port}/readyz") as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(0.2)
    token = await replicas.prometheus_token(admin, plane)
    return process, f"https://127.0.0.1:{webhook_port}", (f"https://127.0.0.1:{metrics_port}/metrics", token)


async def start_standin(plane: Any) -> asyncio.subprocess.Process:
    """The KubeVirt stand-in in a process of its own, as the demo runs it (virt-controller is its own process):
    its passes do not wait behind this process's timing watches and agents' reports."""
    log = (plane.directory / "logs" / "kubevirt-standin.log").open("ab")
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cozygpu.devcluster.kubevirt", "--dir", str(plane.directory),
        stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, cwd=ROOT)


async def register_webhooks(admin: Client, plane: Any, url: str, *, hook: bool = False) -> str:
    """The webhooks as the chart registers them on this cluster: where it serves MutatingAdmissionPolicy, the
    order's finalizer comes from the chart's policy and the finalizer hook is left out. Says which."""
    from cozygpu.admission.webhooks import configurations, finalizer_policy
    from cozygpu.devcluster import apply, chart
    from tests.admission.harness import wait_called

    selector = {"matchLabels": {BENCH_LABEL: "tenant"}}
    by_policy = not hook and chart.MUTATING_ADMISSION_POLICY in await chart.served_api_versions(admin)
    if by_policy:
        await apply.apply_objects(admin, list(finalizer_policy(namespace_selector=selector, name="cozygpu-compare")))
    validating, mutating = configurations(
        url, base64.b64encode(plane.ca_file.read_bytes()).decode(), timeout_seconds=15,
        namespace_selector=selector, name="cozygpu-compare", finalizer_hook=not by_policy)
    await admin.create(VALIDATING, validating)
    await admin.create(MUTATING, mutating)
    await wait_called(admin, "tenant-cmp0")
    return ("the order's finalizer from the MutatingAdmissionPolicy (one webhook call per order)" if by_policy
            else "the order's finalizer from its webhook (two webhook calls per order)")


async def warm_up(bench: Bench) -> None:
    """A few of each, untimed: the scheduler's and the binder's first cycles after the fleet changed."""
    for _ in range(5):
        for system in bench.systems:
            await bench.one(system)(bench.admin)
            await bench.stop_vms()


STEPS = ("create → binder's cache saw it", "waiting for its pass", "snapshot", "plan", "plan_writes",
         "other in pass before writes", "status write → Bound seen here", "total")
#: The part of "waiting for its pass" spent while a housekeeping work's pass ran (passes never overlap):
#: what placement waits behind another work (one write at most per pass, by design).
WAIT_IN_OTHER = "  of the wait, another work's pass running"


def answer_path(records: list[dict[str, Any]], orders: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per phase ("N one", "N burst"; "N one DRA" for B-DRA's orders), each step of every timed order's path,
    in ms."""
    others = sorted((r for r in records if r["lane"] != PLACEMENT), key=lambda r: float(r["started"]))
    starts = [r["started"] for r in others]
    by_device: dict[str, dict[str, Any]] = {}
    for record in records:
        for key in record.get("binds", ()):
            by_device.setdefault(key, record)
    out: dict[str, dict[str, list[float]]] = {}
    for order in orders:
        found = by_device.get(order["key"])
        if not order["phase"] or found is None or order["key"] not in found.get("saw", {}):
            continue
        record = found
        phase = order["phase"] + (" DRA" if order.get("dra") else "")
        steps = out.setdefault(phase, {step: [] for step in (*STEPS, WAIT_IN_OTHER)})
        saw, started = record["saw"][order["key"]], record["started"]
        writes_started = record.get("writes_started", record["ended"])
        inside = sum(record.get(k, 0.0) for k in ("snapshot", "plan", "plan_writes"))
        values = [saw - order["sent"], started - saw, record.get("snapshot", 0.0), record.get("plan", 0.0),
                  record.get("plan_writes", 0.0), writes_started - started - inside, order["seen"] - writes_started,
                  order["seen"] - order["sent"]]
        for step, value in zip(STEPS, values, strict=True):
            steps[step].append(value * 1000)
        waited, j = 0.0, bisect.bisect_left(starts, started) - 1
        while j >= 0 and others[j]["ended"] > saw:  # passes never overlap: walk back over those in the way
            waited += max(0.0, min(others[j]["ended"], started) - max(others[j]["started"], saw))
            j -= 1
        steps[WAIT_IN_OTHER].append(waited * 1000)
    return out


#: A B-DRA order's hold, step by step (each after the first adds up to the total).
HOLD_STEPS = ("create → Bound seen here (B-DRA, for reference)", "create → the placement pass that bound it ended",
              "→ the claims pass that made its claim started", "that pass: snapshot, plan, the claim created (POST)",
              "the allocation written (PATCH status)", "allocation answered → seen here",
              "total: create → allocation seen here")


def hold_path(records: list[dict[str, Any]], orders: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per phase ("N one"), each step of every timed B-DRA order's hold, in ms: the placement pass that bound
    it, then the claims pass that created its claim (the allocation follows in that pass, on the version the
    create answered). Between the two the claims lane waits: placement goes first, and a housekeeping lane
    starts only once the cache has seen every lane's writes (``passes/driver.py``, read-your-writes)."""
    placed: dict[str, dict[str, Any]] = {}
    held: dict[str, dict[str, Any]] = {}
    for record in records:
        for key in record.get("binds", ()):
            placed.setdefault(key, record)
        if record["lane"] == "claims":
            for key in record.get("claim_keys", ()):
                held.setdefault(key, record)
    out: dict[str, dict[str, list[float]]] = {}
    for order in orders:
        bound, found = placed.get(order["key"]), held.get(order["key"])
        if (not order.get("dra") or not order["phase"] or bound is None or found is None
                or "claims_answered" not in found):
            continue
        record = found
        steps = out.setdefault(order["phase"], {step: [] for step in HOLD_STEPS})
        created, answered = record["claims_created"], record["claims_answered"]
        values = [order["seen"] - order["sent"], bound["ended"] - order["sent"], record["started"] - bound["ended"],
                  created - record["started"], answered - created, order["held"] - answered,
                  order["held"] - order["sent"]]
        for step, value in zip(HOLD_STEPS, values, strict=True):
            steps[step].append(value * 1000)
    return out


def row(values: list[float]) -> tuple[float, float, float, float]:
    return (percentile(values, 50), percentile(values, 90), percentile(values, 99), max(values))


def table(results: dict[int, dict[str, Any]]) -> list[str]:
    lines = [f"N={n}: every node's agent report rewritten throughout the timing, {r['rate']:.2f} writes/s"
             f" ({r['due']:.2f} due: each node every {r['interval']:.0f} s, the agent's default)"
             for n, r in ((n, result["reports"]) for n, result in results.items() if "reports" in result)]
    lines += ["| N | what | n | p50 ms | p90 ms | p99 ms | max ms | burst of all, wall ms | ÷ floor p50 / p99 |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n, result in results.items():
        floor = row(result["one"]["floor"])
        for system in result["one"]:
            values = result["one"][system]
            p50, p90, p99, top = row(values)
            wall = result["burst"][system]["wall_ms"]
            refused = result["burst"][system].get("refused", 0)
            burst = f"{wall:.0f}" + (f" ({refused} refused)" if refused else "")
            lines.append(f"| {n} | {LABELS[system]} | {len(values)} | {p50:.1f} | {p90:.1f} | {p99:.1f} | {top:.1f}"
                         f" | {burst} | {p50 / floor[0]:.2f} / {p99 / floor[2]:.2f} |")
    lines += ["", "| N | ratio | p50 | p90 | p99 | max | burst wall |", "|---:|---|---:|---:|---:|---:|---:|"]
    for n, result in results.items():
        for system, theirs in RATIOS:
            if system not in result["one"]:
                continue
            a, other = row(result["one"][theirs]), row(result["one"][system])
            wall = result["burst"][system]["wall_ms"] / result["burst"][theirs]["wall_ms"]
            lines.append(f"| {n} | {system}/{theirs} | "
                         + " | ".join(f"{o / x:.2f}" for o, x in zip(other, a, strict=True)) + f" | {wall:.2f} |")
    sizes = list(results)
    if len(sizes) > 1:
        first = sizes[0]
        lines += ["", f"| growth from N={first} | " + " | ".join(f"N={n} p50 / p99" for n in sizes[1:]) + " |",
                  "|---|" + "---:|" * (len(sizes) - 1)]
        for system in results[first]["one"]:
            base = row(results[first]["one"][system])
            cells = []
            for n in sizes[1:]:
                now = row(results[n]["one"][system])
                cells.append(f"{now[0] / base[0]:.2f}× / {now[2] / base[2]:.2f}×")
            lines.append(f"| {LABELS[system]} | " + " | ".join(cells) + " |")
    return lines


def picture(results: dict[int, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(results)
    systems = [s for s in results[sizes[0]]["one"] if s not in C_STEPS]
    figure, axes = plt.subplots(1, len(sizes), figsize=(max(4.2, 0.75 * len(systems)) * len(sizes), 4.2),
                                sharey=True, squeeze=False)
    colours = {"floor": "#9e9e9e", "A": "#1f77b4", "B": "#2ca02c", "C": "#d62728", ADMIT: "#ff9896",
               "A-DRA": "#17becf",
               "B-DRA": "#bcbd22", HOLD: "#8c564b"}
    ticks = {"floor": "floor", "A": "A sched", "B": "B binder", "C": "C VM start", ADMIT: "C-admit",
             "A-DRA": "A-DRA sched",
             "B-DRA": "B-DRA Bound", HOLD: "B-DRA hold"}
    for axis, n in zip(axes[0], sizes, strict=True):
        data = [results[n]["one"][s] for s in systems]
        parts = axis.violinplot(data, showmedians=True, showextrema=False)
        for body, system in zip(parts["bodies"], systems, strict=True):
            body.set_facecolor(colours[system])
            body.set_alpha(0.6)
        for i, system in enumerate(systems, start=1):
            p99 = percentile(results[n]["one"][system], 99)
            axis.plot([i - 0.25, i + 0.25], [p99, p99], color="black", linewidth=1)
        axis.set_xticks(range(1, len(systems) + 1), [ticks[s] for s in systems], rotation=30 if len(systems) > 4 else 0)
        axis.set_yscale("log")
        axis.set_title(f"{n} nodes (one at a time)")
        axis.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("create → answer seen, ms (log; bar = p99)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


async def drive(plane: Any, args: argparse.Namespace, sizes: list[int], run_started: float) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, generate_latest

    from cozygpu.devcluster import apply
    from cozygpu.devcluster.kubevirt import KubeVirtStandIn
    from cozygpu.runtime.looplag import LoopLag
    from tests.support.crds import install_fixture_crd

    results: dict[int, dict[str, Any]] = {}
    profile: dict[str, dict[str, list[float]]] = {}
    loads: dict[int, tuple[str, str]] = {}
    controller: asyncio.subprocess.Process | None = None
    standin: asyncio.subprocess.Process | None = None
    idle: asyncio.subprocess.Process | None = None
    #: Monotonic (start, end) of each size's timed spans (the clock is the machine's: the controller's sampler
    #: stamps its stretches on it too).
    windows: list[tuple[float, float]] = []
    own_registry = CollectorRegistry()
    bench: Bench | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            admin = await stack.enter_async_context(plane.client())
            burst_clients = [await stack.enter_async_context(plane.client()) for _ in range(4)]
            # The agents' reports through a client (a connection pool) of their own.
            reports_client = await stack.enter_async_context(plane.client())
            await apply.install_crds(admin)
            for crd in ("virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io"):
                await install_fixture_crd(admin, crd)
            bench = Bench(admin, burst_clients, args, reports=reports_client)
            await bench.setup()
            own_lag = LoopLag(own_registry)
            background = [asyncio.create_task(bench.reports.run(), name="agent-reports"),
                          asyncio.create_task(own_lag.run(), name="bench-loop-lag")]
            if args.standin_in_process:
                standin_client = await stack.enter_async_context(plane.client())
                background.append(asyncio.create_task(KubeVirtStandIn(standin_client).run(), name="kubevirt-standin"))
            else:
                standin = await start_standin(plane)
            controller, url, metrics_url = await start_controller(plane, admin, args)
            idle, idle_url = await start_idle_loop(plane)
            finalizer = await register_webhooks(admin, plane, url, hook=args.finalizer_webhook)
            print(f"controller ready, webhooks called, {finalizer}; client limit: kube-scheduler QPS {QPS:.0f}"
                  f" burst {BURST} per clientset (its default), cozygpu "
                  f"{'unlimited' if args.no_qps_match else f'QPS {QPS:.0f} burst {BURST} per client'}",
                  flush=True)
            watches = [asyncio.create_task(w.run()) for w in bench.watches()]
            for w in bench.watches():
                await asyncio.wait_for(w.synced.wait(), 60)
            for n in sizes:
                if args.budget_s and time.monotonic() - run_started > args.budget_s:
                    print(f"N={n}: skipped, the run's time budget ({args.budget_s:.0f} s) is spent", flush=True)
                    break
                grown_from = await metrics_of(metrics_url)
                took = await bench.grow(n)
                gc.collect()
                gc.freeze()  # what this process holds of the fleet: no full collection walks it during a timing
                grown_cpu = await asyncio.to_thread(thread_times, controller.pid)
                grown = await metrics_of(metrics_url)  # the lag of the fleet's growth apart from the run's
                idle_grown = await idle_metrics(idle_url)
                grown_at = time.monotonic()
                bench_grown = values_of(generate_latest(own_registry).decode())
                percent, scored = nodes_to_score(n)
                print(f"N={n}: fleet ready and reported by the binder in {took:.0f}s; kube-scheduler default"
                      f" percentageOfNodesToScore: {percent}% -> scores {scored} feasible nodes per pod; agents'"
                      f" reports: every node every {bench.reports.interval:.0f} s, spread evenly,"
                      f" {bench.reports.target():.2f} writes/s due; {load()}", flush=True)
                cadence, bench.moved = bench.reports.mark(), 0
                await warm_up(bench)
                start_load = load()
                before = await metrics_of(metrics_url)
                bench.phase = f"{n} one"
                one = await bench.rounds(args.samples, args.rounds)
                after_one = await metrics_of(metrics_url)
                bench.phase = ""
                stopped_cpu = await asyncio.to_thread(thread_times, controller.pid)
                stopped = await metrics_of(metrics_url)
                idle_stopped = await idle_metrics(idle_url)
                windows.append((grown_at, time.monotonic()))
                frozen = await bench.frozen(controller, max(10, args.samples // 2))
                resumed_cpu = await asyncio.to_thread(thread_times, controller.pid)
                resumed = await metrics_of(metrics_url)  # the SIGSTOP is no lag of the controller's own
                idle_resumed = await idle_metrics(idle_url)
                resumed_at = time.monotonic()
                await bench.clear_pods()
                bursts: dict[str, Any] = {}
                for system in bench.systems:  # C after B: it starts the devices B's burst bound
                    bench.phase = f"{n} burst"
                    timed_burst = await bench.burst(system, args.burst)
                    bench.phase = ""
                    for key, burst in timed_burst.items():
                        refused = burst["refused"]
                        print(f"    burst {key}: {args.burst} in {burst['wall_ms']:.0f} ms"
                              + (f", {refused} refused ({'; '.join(burst['why'])})" if refused else ""), flush=True)
                    bursts.update(timed_burst)
                await bench.clear_pods()
                reports = {"rate": bench.reports.rate(cadence), "due": bench.reports.target(),
                           "interval": bench.reports.interval, "failed": bench.reports.failed}
                print(f"    agents' reports over N={n}'s timing: {reports['rate']:.2f} writes/s achieved"
                      f" ({reports['due']:.2f} due), {reports['failed']} failed over the run; C's VMs started"
                      f" on a hold moved since B saw it Bound: {bench.moved}", flush=True)
                ended_cpu = await asyncio.to_thread(thread_times, controller.pid)
                ended = await metrics_of(metrics_url)
                idle_ended = await idle_metrics(idle_url)
                windows.append((resumed_at, time.monotonic()))
                bench_ended = values_of(generate_latest(own_registry).decode())
                run_spans = ((grown, stopped), (resumed, ended))
                lag, growth_lag = loop_lag(*run_spans), loop_lag((grown_from, grown))
                busy_lag, cpu_wait = loop_lag(*run_spans, family=BUSY_LAG), loop_lag(*run_spans, family=CPU_WAIT)
                print(f"    controller event-loop lag over N={n}, the fleet's growth: {said(growth_lag)}", flush=True)
                # The run apart and in its two phases: one at a time, and the bursts of many at once.
                for what, spans in (("the run: samples, bursts, agents' reports (not the SIGSTOP)", run_spans),
                                    ("  one at a time (warm-up and samples)", ((grown, stopped),)),
                                    ("  the bursts", ((resumed, ended),))):
                    print(f"    controller event-loop lag over N={n}, {what}: {said(loop_lag(*spans))}; the loop's "
                          f"own (less its thread's wait for a CPU): {said(loop_lag(*spans, family=BUSY_LAG))}; its "
                          f"thread's wait for a CPU per wake-up: {said(loop_lag(*spans, family=CPU_WAIT))}",
                          flush=True)
                idle_spans = ((idle_grown, idle_stopped), (idle_resumed, idle_ended))
                idle_lag = loop_lag(*idle_spans)
                print(f"    an idle uvloop process's lag over the same spans (the control: a loop with no work but "
                      f"the same ticker, so what the machine alone makes a loop wait): {said(idle_lag)}; its "
                      f"thread's wait for a CPU per wake-up: {said(loop_lag(*idle_spans, family=CPU_WAIT))}",
                      flush=True)
                print(f"    this process's event-loop lag over N={n} (its watches time every figure; the agents' "
                      f"reports{' and the stand-in' if args.standin_in_process else ''} run here): "
                      f"{said(loop_lag((bench_grown, bench_ended)))}; its own: "
                      f"{said(loop_lag((bench_grown, bench_ended), family=BUSY_LAG))}", flush=True)
                print(f"    the controller's loop thread over N={n}'s run (not the SIGSTOP), "
                      f"{thread_share((grown_cpu, stopped_cpu), (resumed_cpu, ended_cpu))}; {load()}", flush=True)
                print(f"    read-model rebuilds over N={n}, the fleet's growth: {rebuilds(grown_from, grown)}; "
                      f"the run: {rebuilds(grown, ended)}", flush=True)
                print(f"    garbage collections over N={n}, the fleet's growth: {gc_pauses((grown_from, grown))}; "
                      f"the run: {gc_pauses((grown, stopped), (resumed, ended))}", flush=True)
                results[n] = {"one": one, "burst": bursts, "shares": shares(before, after_one), "frozen": frozen,
                              "percent": percent, "scored": scored, "lag": lag, "busy_lag": busy_lag,
                              "cpu_wait": cpu_wait, "idle_lag": idle_lag,
                              "growth_lag": growth_lag, "reports": reports}
                loads[n] = (start_load, load())
                print("\n".join(table({n: results[n]})), flush=True)
                if args.json:  # after each size, so a run cut short keeps what it measured
                    await asyncio.to_thread(Path(args.json).write_text, json.dumps(
                        {"results": {str(k): v for k, v in results.items()}, "loads": loads}))
                if args.png:
                    await asyncio.to_thread(picture, results, Path(args.png))
            for task in watches + background:
                task.cancel()
            await asyncio.gather(*watches, *background, return_exceptions=True)
    finally:
        for process in (controller, standin, idle):
            if process is not None and process.returncode is None:
                process.terminate()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), 60)
    records: list[dict[str, Any]] = []
    requests: dict[str, Any] = {}
    holds: dict[str, dict[str, list[float]]] = {}
    with contextlib.suppress(FileNotFoundError, ValueError):
        records = json.loads(await asyncio.to_thread((plane.directory / RECORDS).read_text))
        profile = answer_path(records, bench.orders if bench is not None else [])
        holds = hold_path(records, bench.orders if bench is not None else [])
        requests = json.loads(await asyncio.to_thread((plane.directory / RECORDS).with_suffix(
            ".requests.json").read_text))
    stalls: list[dict[str, Any]] = []
    with contextlib.suppress(FileNotFoundError, ValueError):
        stalls = json.loads(await asyncio.to_thread((plane.directory / RECORDS).with_suffix(".stalls.json").read_text))
    return {"results": results, "profile": profile, "holds": holds, "loads": loads, "records": records,
            "requests": requests, "stalls": stalls, "windows": windows, "started": run_started}


def stall_table(what: str, stalls: list[dict[str, Any]], at_least_ms: float, started: float) -> None:
    """The controller's busy stretches (the ``StallProbe``'s) of ``what``: by where, and the longest."""
    seconds = sum(st["seconds"] for st in stalls)
    waited = sum(st.get("cpu_wait", 0.0) for st in stalls)
    print(f"\n## the controller's event loop busy {at_least_ms:g} ms or more at a stretch {what}: {len(stalls)} times"
          f" ({seconds * 1000:.0f} ms in all, of which its thread waited {waited * 1000:.0f} ms for a CPU; "
          "sampled every 2 ms; by the cozygpu function seen most in it: count, total / max ms)")
    by_where: dict[str, list[float]] = {}
    for stall in stalls:
        by_where.setdefault(stall["where"][0][0] if stall["where"] else "?", []).append(stall["seconds"] * 1000)
    for where, spans in sorted(by_where.items(), key=lambda item: -sum(item[1]))[:12]:
        print(f"  {where:<64} {len(spans):5d}  {sum(spans):8.0f} / {max(spans):6.0f}")
    if stalls:
        print("  the longest, seconds into the run:")
    for stall in sorted(stalls, key=lambda st: -st["seconds"])[:8]:
        where = ", ".join(f"{w} ({n})" for w, n in stall["where"])
        print(f"    {stall['at'] - started:7.1f} s  {stall['seconds'] * 1000:6.0f} ms, waiting for a CPU "
              f"{stall.get('cpu_wait', 0.0) * 1000:4.0f} ms, {stall.get('samples', 0):3d} samples  {where}")


def report(run: dict[str, Any], args: argparse.Namespace, sizes: list[int], run_started: float) -> None:
    results: dict[int, dict[str, Any]] = run["results"]
    profile: dict[str, dict[str, list[float]]] = run["profile"]
    loads: dict[int, tuple[str, str]] = run["loads"]
    print("\n## the table (one at a time; bursts: wall time until the last is bound / running / answered)\n")
    print("\n".join(table(results)))
    print("\n## kube-scheduler's node search and the load")
    for n, result in results.items():
        print(f"  N={n}: percentageOfNodesToScore {result['percent']}% -> {result['scored']} nodes;"
              f" {loads[n][0]} at start, {loads[n][1]} at end")
    print("\n## the same, with the controller frozen (SIGSTOP) for a few seconds: its cost to the others (ms)")
    for n, result in results.items():
        for system, values in result["frozen"].items():
            p50, p90, p99, top = row(values)
            print(f"  N={n} {LABELS[system]:<28} p50 {p50:7.1f}  p90 {p90:7.1f}  p99 {p99:7.1f}  max {top:7.1f}"
                  f"  (n={len(values)})")
    print("\n## bursts, per-item latency (ms)")
    for n, result in results.items():
        for system, burst in result["burst"].items():
            values = burst["latencies"]
            p50, p90, p99, top = row(values)
            refused = f"; {burst['refused']} refused: {'; '.join(burst['why'])}" if burst.get("refused") else ""
            print(f"  N={n} {LABELS[system]:<28} p50 {p50:7.1f}  p90 {p90:7.1f}  p99 {p99:7.1f}  max {top:7.1f}"
                  f"  all in {burst['wall_ms']:.0f} (n={len(values)}{refused})")
    print("\n## where a VM start's time goes (controller metrics, mean ms per call, one at a time)")
    for n, result in results.items():
        for key, value in sorted(result["shares"].items()):
            print(f"  N={n} {key}: {value:.1f}")
    for phase, steps in profile.items():
        n_orders = len(steps["total"])
        size, when, *dra = phase.split()
        how = "one at a time" if when == "one" else "in the burst"
        print(f"\n## where an order's time goes ({'B-DRA' if dra else 'B'}), N={size}, {n_orders} orders {how}"
              f" (median / p90 / p99 ms)")
        for step in (*STEPS[:2], WAIT_IN_OTHER, *STEPS[2:]):
            values = steps[step]
            print(f"  {step:<58} {statistics.median(values):7.2f} {percentile(values, 90):7.2f}"
                  f" {percentile(values, 99):7.2f}")
    holds: dict[str, dict[str, list[float]]] = run.get("holds") or {}
    for phase, steps in holds.items():
        size, when = phase.split()
        print(f"\n## where a DRA hold's time goes (B-DRA: the claims work after placement), N={size},"
              f" {len(steps[HOLD_STEPS[-1]])} orders {'one at a time' if when == 'one' else 'in the burst'}"
              f" (median / p90 / p99 ms)")
        for step in HOLD_STEPS:
            values = steps[step]
            print(f"  {step:<58} {statistics.median(values):7.2f} {percentile(values, 90):7.2f}"
                  f" {percentile(values, 99):7.2f}")
    by_lane: dict[str, list[float]] = {}
    for record in run.get("records", []):
        by_lane.setdefault(record["lane"], []).append((record["ended"] - record["started"]) * 1000)
    if by_lane:
        print("\n## the binder's passes over the whole run, by work (count; median / p99 / max ms)")
        for name, spans in by_lane.items():
            print(f"  {name:<14} {len(spans):7d}  {statistics.median(spans):7.2f} {percentile(spans, 99):7.2f}"
                  f" {max(spans):7.2f}")
    if args.stall_ms > 0:  # 0: no sampler ran
        stalls = run.get("stalls") or []
        windows = run.get("windows") or []
        timed = [stall for stall in stalls if any(start <= stall["at"] < end for start, end in windows)]
        stall_table("over its life", stalls, args.stall_ms, run["started"])
        stall_table("in the sizes' timed runs (samples and bursts; not the growth, not the SIGSTOP)", timed,
                    args.stall_ms, run["started"])
    requests = run.get("requests") or {}
    if requests:
        seconds = float(requests["seconds"])
        counts = sorted(requests["requests"].items(), key=lambda item: -item[1])
        total = sum(count for _, count in counts)
        print(f"\n## the controller's API requests over its {seconds:.0f} s ({total / seconds:.1f}/s; the limit"
              f" is {'none' if args.no_qps_match else f'{QPS:.0f}/s'})")
        for kind, count in counts:
            print(f"  {kind:<44} {count:7d}  {count / seconds:6.1f}/s")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": {str(n): r for n, r in results.items()},
                                               "profile": profile, "holds": run.get("holds") or {},
                                               "loads": loads}, indent=1))
    if args.png and results:
        picture(results, Path(args.png))
        print(f"\npicture: {args.png}")
    print(f"\nrun took {time.monotonic() - run_started:.0f} s; {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,5000", help="fleet sizes, ascending (default 100,1000,5000)")
    parser.add_argument("--samples", type=int, default=200, help="one-at-a-time samples per system per size")
    parser.add_argument("--burst", type=int, default=200, help="items created at once per system per size")
    parser.add_argument("--rounds", type=int, default=4, help="rounds the samples are split into")
    parser.add_argument("--budget-s", type=float, default=0.0, help="skip the next size once this many s are spent")
    parser.add_argument("--dra", action="store_true",
                        help="also GPUs from a DRA driver: A-DRA (a pod's own claim) and B-DRA (a GPUDevice of a"
                             " source.dra class: Bound, and its hold claim allocated)")
    parser.add_argument("--quick", action="store_true",
                        help="CI size: 20 and 50 nodes, 20 samples, bursts of 20, with --dra")
    parser.add_argument("--no-qps-match", action="store_true", help="run the controller without client-go's limiter")
    parser.add_argument("--standin-in-process", action="store_true",
                        help="run the KubeVirt stand-in in this process's loop, not in a process of its own")
    parser.add_argument("--finalizer-webhook", action="store_true",
                        help="give orders their finalizer by the webhook even where MutatingAdmissionPolicy is served "
                             "(as on clusters before 1.36)")
    parser.add_argument("--png", help="draw the distributions here (needs the bench extra: matplotlib)")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--controller-log-level", default="warning", help="the controller's --log-level")
    parser.add_argument("--keep", action="store_true", help="leave the plane running")
    parser.add_argument("--stall-ms", type=float, default=20.0,
                        help="print the controller's busy stretches of at least this many ms (default 20; "
                             "0: no sampler in the controller)")
    parser.add_argument("--controller", help=argparse.SUPPRESS)
    parser.add_argument("--idle-loop", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.idle_loop:
        run_idle_loop(args.idle_loop)
        return
    if args.controller:
        sys.exit(run_controller(json.loads(args.controller), qps=None if args.no_qps_match else QPS,
                                records_path=args.records, stall_s=args.stall_ms / 1000))
    if args.quick:
        args.sizes, args.samples, args.burst, args.rounds, args.dra = "20,50", 20, 20, 2, True
    from cozygpu.devcluster import binaries
    from cozygpu.devcluster.plane import ControlPlane

    if binaries.find(binaries.DEFAULT_MINOR) is None:
        sys.exit("control-plane binaries missing: run `python -m cozygpu.devcluster.binaries` first")
    sizes = [int(s) for s in args.sizes.split(",")]
    run_started = time.monotonic()
    print(f"compare_scheduler: sizes {sizes}, {args.samples} samples one at a time in {args.rounds} rounds,"
          f" bursts of {args.burst}{', with DRA' if args.dra else ''}; {load()}", flush=True)
    plane = ControlPlane.start(build=False, full=True, node_lease_seconds=NODE_LEASE_SECONDS, timeout=120)
    print(f"full plane {plane.kubernetes_version} in {plane.directory}", flush=True)
    try:
        run = asyncio.run(drive(plane, args, sizes, run_started))
    finally:
        if args.keep:
            print(f"plane left running in {plane.directory}")
        else:
            plane.stop()
    report(run, args, sizes, run_started)


if __name__ == "__main__":
    main()
