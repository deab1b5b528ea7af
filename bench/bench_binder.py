"""Binder bench: answer latency, housekeeping-pass duration, a storm of requests, new orders, controller RSS.

    python bench/bench_binder.py [--quick] [--keep] [--attach DIR] [--profile]

Starts its own control plane (the project's envtest), installs the CRDs and
the VMI CRD fixture, and creates, at full size: 1,000 Nodes (Ready) with a
GPUNode report of 8 GPUs each (8,000 GPUs), 2,000 running VMIs (a VMI with
``status.activePods`` and its virt-launcher pod, Running on the VMI's node)
and 5,000 GPUDevices, all Bound, the first 2,000 attached to those VMIs.
``--quick`` makes a tenth of everything.

A separate process runs what the controller runs for the binder: the shared
cache and the binder on its pass driver (uvloop), so its RSS is the
controller's. This process plays the webhook and the tenants, each figure
taken through its own watch of GPUDevices:

- answer latency: a bind request written (``status.bindRequest`` on a Bound
  device) → its answer seen in the watch, 200 requests one at a time, idle
  (no pass running) and during a housekeeping pass (written the moment one
  starts; passes never overlap, but a housekeeping work stops between writes
  when placement is due);
- "housekeeping pass": one housekeeping work's pass (attachments, finalizers, usage,
  reports, verify; each its own lane on the driver), its duration on the
  binder process's own clock; the "placement pass" is the placement work's;
- a storm: 200 requests written at once;
- new orders: a Pending GPUDevice created → Bound seen in the watch, by the
  very next placement cycle (the binder process says which lane bound it);
- controller RSS after all this;
- where an answer's time goes: write → the binder's cache sees it → the
  placement pass starts → snapshot → plan → writes → the answer seen here.
  ``--profile`` adds a cProfile of the idle placement passes and of five housekeeping
  passes that write nothing, both last (it slows them).

Targets: answer p99 <= 50 ms, housekeeping pass <= 150 ms, RSS <= 300 MB. Figures are
printed with their ratio to the target, never asserted. The machine is shared:
read the spread, not one number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_cache import bounded, rss_mb  # noqa: E402
from cozygpu import keys  # noqa: E402
from cozygpu.kube import Client, resource_path  # noqa: E402

ANSWER_P99_TARGET_MS = 50.0
HOUSEKEEPING_PASS_TARGET_MS = 150.0
RSS_TARGET_MB = 300.0
RESOURCE = "nvidia.com/GH100_H100_SXM5_80GB"
CLASS = "h100"
TENANTS = 100
GPUS_PER_NODE = 8

DEVICES = (keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL)
VMIS = ("kubevirt.io", "v1", "virtualmachineinstances")


def stamp(when: datetime | None = None) -> str:
    return (when or datetime.now(UTC)).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- populating (this process) ---------------------------------------------------------------


def sizes(quick: bool) -> dict[str, int]:
    scale = 0.1 if quick else 1.0
    return {"nodes": int(1000 * scale), "vmis": int(2000 * scale), "devices": int(5000 * scale),
            "requests": 40 if quick else 200, "storm": 40 if quick else 200, "orders": 20 if quick else 50}


async def populate(admin: Client, size: dict[str, int]) -> None:
    from tests.cache import shapes

    n_nodes, n_vmis, n_devices = size["nodes"], size["vmis"], size["devices"]
    tenants = [f"tenant-b{i}" for i in range(TENANTS)]
    await bounded(admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": ns}}) for ns in tenants)
    await admin.create(resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL), {
        "apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND,
        "metadata": {"name": CLASS, "finalizers": [keys.CLASS_FINALIZER]},
        "spec": {"vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "memory": "80Gi",
                 "resourceName": RESOURCE, "source": {"devicePlugin": {}}}})

    nodes = resource_path("", "v1", "nodes")
    gpunodes = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                        "lastHeartbeatTime": stamp(), "lastTransitionTime": stamp()}]}}

    async def node(i: int) -> None:
        name = f"node-{i}"
        await admin.create(nodes, shapes.node(name))
        await admin.merge_patch(f"{nodes}/{name}/status", ready)
        await admin.create(gpunodes, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                                      "metadata": {"name": name}})
        devices = [{"address": f"0000:{d + 1:02x}:00.0", "resourceName": RESOURCE, "allocatable": 1,
                    "driver": "vfio-pci"} for d in range(GPUS_PER_NODE)]
        await admin.merge_patch(f"{gpunodes}/{name}/status", {"status": {
            "devices": devices, "resourceNames": [RESOURCE], "agent": {"lastReport": stamp()}}})

    took = await bounded(node(i) for i in range(n_nodes))
    print(f"  {n_nodes} Nodes and GPUNodes ({n_nodes * GPUS_PER_NODE} GPUs) in {took:.1f}s")

    uids: dict[int, str] = {}

    async def vmi(i: int) -> None:
        namespace, name, node_name = tenants[i % TENANTS], f"vm-{i}", f"node-{i % n_nodes}"
        path = resource_path(*VMIS, namespace=namespace)
        made = await admin.create(path, {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                         "metadata": {"name": name}, "spec": {"domain": {"devices": {}}}})
        uids[i] = made["metadata"]["uid"]
        pod_path = resource_path("", "v1", "pods", namespace=namespace)
        pod = await admin.create(pod_path, shapes.launcher_pod(namespace, name, node=node_name,
                                                               vmi_uid=made["metadata"]["uid"]))
        await admin.merge_patch(f"{pod_path}/{pod['metadata']['name']}/status", shapes.launcher_pod_status(pod))
        await admin.merge_patch(f"{path}/{name}/status", {"status": {
            "phase": "Running", "nodeName": node_name, "activePods": {pod["metadata"]["uid"]: node_name}}})

    took = await bounded(vmi(i) for i in range(n_vmis))
    print(f"  {n_vmis} running VMIs with their launcher pods in {took:.1f}s")

    async def device(i: int) -> None:
        namespace = tenants[i % TENANTS]
        path = resource_path(*DEVICES, namespace=namespace)
        name = f"gpu-{i}"
        await admin.create(path, shapes.gpu_device(namespace, name, class_name=CLASS))
        status = shapes.gpu_device_status(f"node-{i % n_nodes}")
        if i < n_vmis:  # attached to the VMI that runs it, by its UID
            status["status"]["attachment"] = {"vmi": f"vm-{i}", "uid": uids[i], "attachedAt": stamp(),
                                              "requestId": uuid.uuid4().hex}
        await admin.merge_patch(f"{path}/{name}/status", status)

    took = await bounded(device(i) for i in range(n_devices))
    print(f"  {n_devices} GPUDevices, Bound, {min(n_vmis, n_devices)} attached, in {took:.1f}s")


# -- the binder (child process) ----------------------------------------------------------------


async def run_binder(kubeconfig: str, *, profile: bool) -> None:
    import cProfile
    import io
    import pstats

    from prometheus_client import CollectorRegistry

    from cozygpu.base.clock import LoopClock
    from cozygpu.binder import cycle, place
    from cozygpu.binder.binder import Binder, BinderConfig
    from cozygpu.binder.context import Context
    from cozygpu.binder.loop import binder_driver
    from cozygpu.binder.metrics import BinderMetrics
    from cozygpu.cache import Cache
    from cozygpu.model.placement import Answer, Bind
    from cozygpu.views import specs as known

    def emit(**fields: Any) -> None:
        print(json.dumps(fields), flush=True)

    registry = CollectorRegistry()
    current: dict[str, Any] = {}
    seen_at: dict[str, float] = {}
    profiler = cProfile.Profile() if profile else None
    profiling = False
    housekeeping_profiler = cProfile.Profile() if profile else None
    profiling_housekeeping = False

    # Each pass starts a new ``current``: the probes below look it up when they are called.
    def probe(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kw: Any) -> Any:
            return timed(current, name, fn)(*args, **kw)
        return wrapper

    def probe_async(name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def wrapper(*args: Any, **kw: Any) -> Any:
            return await timed_async(current, name, fn)(*args, **kw)
        return wrapper

    real_plan_pass = getattr(cycle, "plan_pass")  # noqa: B009 - patched below, so looked up by name

    def plan_pass(*args: Any, **kw: Any) -> Any:
        started = time.monotonic()
        plan = real_plan_pass(*args, **kw)
        current["plan"] = time.monotonic() - started
        current["answers"] = [a.request_id for a in plan.actions if isinstance(a, Answer)]
        current["binds"] = sum(1 for a in plan.actions if isinstance(a, Bind))
        return plan

    # The binder's module globals, timed where the binder calls them (the bench's probes, nothing else).
    setattr(cycle, "plan_pass", plan_pass)  # noqa: B010
    setattr(place, "plan_writes", probe("plan_writes", getattr(place, "plan_writes")))  # noqa: B009,B010
    setattr(place, "write_sets", probe_async("writes", getattr(place, "write_sets")))  # noqa: B009,B010

    async with await Client.from_kubeconfig(kubeconfig) as client:
        cache = Cache(client, registry=registry)
        binder = Binder(cache, client, BinderConfig(identity="bench", report_stale_after=timedelta(hours=6)),
                        clock=LoopClock(), metrics=BinderMetrics.on(registry))
        # The works' shared context, timed where they call it (its class: a slotted instance takes no attribute).
        setattr(Context, "snapshot", probe_async("snapshot", Context.snapshot))  # noqa: B010

        def seen(event: Any) -> None:
            request = ((event.obj.get("status") or {}).get("bindRequest") or {}).get("id")
            if request and request not in seen_at:
                seen_at[request] = time.monotonic()

        cache.informer(known.GPU_DEVICES).subscribe(seen)
        placement_pass = binder.placement.run

        async def answer(writes: Any, **kw: Any) -> None:
            nonlocal current
            current = {"started": time.monotonic()}
            if profiler is not None and profiling:
                profiler.enable()
            try:
                await placement_pass(writes, **kw)
            finally:
                if profiler is not None and profiling:
                    profiler.disable()
                current["ended"] = time.monotonic()
                emit(lane="placement", **current)

        def housekeeping(work: str, run: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def housekeeping(writes: Any, stop: Any) -> Any:
                return await timed_housekeeping(work, lambda: run(writes, stop), writes)
            return housekeeping

        async def timed_housekeeping(work: str, run: Callable[[], Awaitable[Any]], writes: Any) -> Any:
            """A housekeeping work's pass: the bench's "housekeeping" lane (every work but placement)."""
            nonlocal current
            current = {"started": time.monotonic()}
            nodes_rv = cache.informer(known.NODES).resource_version
            emit(lane="housekeeping", phase="start", work=work)
            if housekeeping_profiler is not None and profiling_housekeeping:
                housekeeping_profiler.enable()
            try:
                return await run()
            finally:
                if housekeeping_profiler is not None and profiling_housekeeping:
                    housekeeping_profiler.disable()
                current["ended"] = time.monotonic()
                emit(lane="housekeeping", phase="end", work=work, duration=current["ended"] - current["started"],
                     nodes_rv=nodes_rv, wrote=len(writes.as_dict()), **{
                         k: v for k, v in current.items() if k in ("snapshot", "plan", "writes", "binds")})

        # The driver's lanes call these (``Binder.lanes`` reads the works' ``run`` when the driver is built).
        binder.placement.run = answer  # type: ignore[method-assign]
        for work in ("claims", "attachments", "ledger", "finalizers", "usage", "reports", "verifier"):
            each = getattr(binder, work)
            each.run = housekeeping(work, each.run)
        driver = binder_driver(binder, cache, registry=registry)
        async with cache.running():
            await cache.wait_synced(*[s for s in binder.kinds if s.group in ("", keys.GROUP, "kubevirt.io")
                                      if s is not known.KUBEVIRTS], timeout=600)
            gc.collect()
            emit(lane="synced", rss=rss_mb()[0])
            task = asyncio.create_task(driver.run())
            loop = asyncio.get_running_loop()
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                order = json.loads(line) if line else {"do": "stop"}
                if order["do"] == "profile":
                    profiling = bool(order["on"])
                elif order["do"] == "profile_housekeeping":
                    profiling_housekeeping = bool(order["on"])
                elif order["do"] == "report":
                    gc.collect()
                    rss, peak = rss_mb()
                    text = housekeeping_text = ""
                    if profiler is not None and housekeeping_profiler is not None:
                        out = io.StringIO()
                        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
                        text = out.getvalue()
                        out = io.StringIO()
                        pstats.Stats(housekeeping_profiler, stream=out).sort_stats("cumulative").print_stats(40)
                        housekeeping_text = out.getvalue()
                    emit(lane="report", rss=rss, peak=peak, seen=seen_at, profile=text,
                         profile_housekeeping=housekeeping_text)
                else:
                    break
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


# -- measuring (this process) ------------------------------------------------------------------


class Watcher:
    """GPUDevices through this process's own cache (one watch): when each answer and each Bound was seen."""

    def __init__(self, admin: Client) -> None:
        from prometheus_client import CollectorRegistry

        from cozygpu.cache import Cache
        from cozygpu.views import specs as known

        self.cache = Cache(admin, registry=CollectorRegistry())
        self.cache.add(known.GPU_DEVICES)
        self.answers: dict[str, tuple[float, str]] = {}
        self.bound: dict[tuple[str, str], float] = {}
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.cache.informer(known.GPU_DEVICES).subscribe(self._event)

    def _event(self, event: Any) -> None:
        now = time.monotonic()
        status = event.obj.get("status") or {}
        answer = status.get("bindAnswer") or {}
        if answer.get("id") and answer["id"] not in self.answers:
            self.answers[answer["id"]] = (now, str(answer.get("result")))
            waiter = self.waiting.pop(answer["id"], None)
            if waiter is not None and not waiter.done():
                waiter.set_result(now)
        meta = event.obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if status.get("phase") == "Bound" and key not in self.bound:
            self.bound[key] = now
            waiter = self.waiting.pop("/".join(key), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(now)

    def expect(self, token: str) -> asyncio.Future[float]:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[token] = future
        return future


class Child:
    """The binder process: its lines, sorted by lane, and the orders sent to it."""

    def __init__(self, process: asyncio.subprocess.Process, poke: Callable[[], Awaitable[str]]) -> None:
        self.process = process
        self.poke = poke
        self.placement_passes: list[dict[str, Any]] = []
        self.housekeeping_passes: list[dict[str, Any]] = []
        self.housekeeping_started = asyncio.Event()
        self.housekeeping_ended = asyncio.Event()
        self.reports: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.synced: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.running_housekeeping = False

    async def read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            try:
                fields = json.loads(line)
            except ValueError:
                continue
            lane = fields.get("lane")
            if lane == "placement":
                self.placement_passes.append(fields)
            elif lane == "housekeeping" and fields["phase"] == "start":
                self.running_housekeeping = True
                self.housekeeping_started.set()
            elif lane == "housekeeping":
                self.running_housekeeping = False
                self.housekeeping_passes.append(fields)
                self.housekeeping_ended.set()
            elif lane == "synced":
                self.synced.set_result(fields)
            elif lane == "report":
                await self.reports.put(fields)

    async def send(self, **order: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(order) + "\n").encode())
        await self.process.stdin.drain()

    async def quiet(self, timeout: float = 600) -> None:
        """Poke a housekeeping pass (a Node label), then wait until one ends that wrote nothing."""
        async with asyncio.timeout(timeout):
            self.housekeeping_ended.clear()
            poked = int(await self.poke())
            while True:
                await self.housekeeping_ended.wait()
                self.housekeeping_ended.clear()
                last = self.housekeeping_passes[-1]
                # A pass whose snapshot held the poke and that wrote nothing.
                if int(last["nodes_rv"] or 0) >= poked and not last["wrote"]:
                    await asyncio.sleep(0.05)
                    if not self.running_housekeeping:
                        return


def timed(into: dict[str, Any], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, adding the seconds each call takes to ``into[name]``."""
    def wrapper(*args: Any, **kw: Any) -> Any:
        started = time.monotonic()
        try:
            return fn(*args, **kw)
        finally:
            into[name] = into.get(name, 0.0) + time.monotonic() - started
    return wrapper


def timed_async(into: dict[str, Any], name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``timed`` for a coroutine function: the seconds until its coroutine is done, not made."""
    async def wrapper(*args: Any, **kw: Any) -> Any:
        started = time.monotonic()
        try:
            return await fn(*args, **kw)
        finally:
            into[name] = into.get(name, 0.0) + time.monotonic() - started
    return wrapper


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values_ms: list[float]) -> str:
    return (f"p50 {percentile(values_ms, 50):.1f} ms, p99 {percentile(values_ms, 99):.1f} ms,"
            f" max {max(values_ms):.1f} ms (n={len(values_ms)})")


def ratio(value: float, target: float) -> str:
    return f"{value / target:.2f}x of target {target:.0f} ({'ok' if value <= target else 'OVER'})"


async def request(admin: Client, watcher: Watcher, key: tuple[str, str], *, vmi: str) -> tuple[str, float, float]:
    """Write a bind request on ``key``; returns (id, write sent, answer seen)."""
    request_id = uuid.uuid4().hex
    seen = watcher.expect(request_id)
    path = resource_path(*DEVICES, namespace=key[0], name=key[1], subresource="status")
    sent = time.monotonic()
    await admin.merge_patch(path, {"status": {"bindRequest": {"id": request_id, "vmi": vmi, "time": stamp()}}})
    return request_id, sent, await asyncio.wait_for(seen, timeout=120)


async def measure(admin: Client, child: Child, size: dict[str, int], *, profile: bool) -> dict[str, Any]:
    watcher = Watcher(admin)
    results: dict[str, Any] = {}
    async with watcher.cache.running():
        from cozygpu.views import specs as known

        await watcher.cache.wait_synced(known.GPU_DEVICES, timeout=600)
        await child.quiet()
        n, attached = size["requests"], min(size["vmis"], size["devices"])
        free = [(f"tenant-b{i % TENANTS}", f"gpu-{i}") for i in range(attached, size["devices"])]
        pick = iter(free * 4)
        idle_gap = max(0.05, 2 * statistics.median(p["duration"] for p in child.housekeeping_passes[-3:]))

        async def one(kind: str) -> float:
            key = next(pick)
            request_id, sent, seen = await request(admin, watcher, key, vmi=f"vm-req-{uuid.uuid4().hex[:6]}")
            results.setdefault("ids", {})[request_id] = (kind, sent, seen)
            return (seen - sent) * 1000

        async def after_follow_up() -> None:
            """Each answer's write is a device event, so a housekeeping pass follows it: let it end first."""
            async with asyncio.timeout(max(5.0, 10 * idle_gap)):
                child.housekeeping_ended.clear()
                await child.housekeeping_ended.wait()
            await asyncio.sleep(0.02)

        async def idle_requests(count: int, kind: str) -> list[float]:
            latencies = []
            for _ in range(count):
                while child.running_housekeeping:
                    child.housekeeping_ended.clear()
                    await child.housekeeping_ended.wait()
                latencies.append(await one(kind))
                with contextlib.suppress(TimeoutError):
                    await after_follow_up()
            return latencies

        print(f"  measuring: {n} idle requests", flush=True)
        results["idle"] = await idle_requests(n, "idle")
        print(f"  idle: {summary(results['idle'])}; now {n} during a housekeeping pass", flush=True)

        during = []
        nodes = resource_path("", "v1", "nodes")
        for i in range(n):
            while child.running_housekeeping:
                child.housekeeping_ended.clear()
                await child.housekeeping_ended.wait()
            child.housekeeping_started.clear()
            await admin.merge_patch(f"{nodes}/node-{i % size['nodes']}",
                                    {"metadata": {"labels": {"bench": uuid.uuid4().hex[:8]}}})
            await child.housekeeping_started.wait()
            during.append(await one("during"))
        results["during"] = during
        print(f"  during: {summary(during)}; now a storm of {size['storm']}", flush=True)

        await child.quiet()
        started = time.monotonic()
        storm = await asyncio.gather(*(one("storm") for _ in range(size["storm"])))
        results["storm"] = list(storm)
        results["storm_total"] = (time.monotonic() - started) * 1000
        print(f"  storm: {summary(results['storm'])}; now {size['orders']} new orders", flush=True)

        await child.quiet()
        orders, lanes = [], {"placement": 0, "housekeeping": 0}
        for i in range(size["orders"]):
            await child.quiet()
            namespace, name = f"tenant-b{i % TENANTS}", f"new-{uuid.uuid4().hex[:8]}"
            answers_before = sum(p.get("binds", 0) for p in child.placement_passes)
            seen = watcher.expect(f"{namespace}/{name}")
            sent = time.monotonic()
            await admin.create(resource_path(*DEVICES, namespace=namespace), {
                "apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                "metadata": {"name": name}, "spec": {"className": CLASS, "count": 1}})
            orders.append((await asyncio.wait_for(seen, timeout=120) - sent) * 1000)
            await asyncio.sleep(0.05)  # the placement pass's line may come just after the watch event
            placed = sum(p.get("binds", 0) for p in child.placement_passes) > answers_before
            lanes["placement" if placed else "housekeeping"] += 1
        results["orders"], results["order_lanes"] = orders, lanes
        if profile:  # last, so that its overhead is in no figure above
            await child.send(do="profile", on=True)
            results["profiled"] = await idle_requests(min(n, 40), "profiled")
            await child.send(do="profile", on=False)
            await child.quiet()
            await child.send(do="profile_housekeeping", on=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(120):
                    for i in range(5):  # housekeeping passes that write nothing, each after a Node label change
                        child.housekeeping_ended.clear()
                        await admin.merge_patch(f"{nodes}/node-{i}",
                                                {"metadata": {"labels": {"bench": uuid.uuid4().hex[:8]}}})
                        await child.housekeeping_ended.wait()
            await child.send(do="profile_housekeeping", on=False)
        await child.send(do="report")
        results["report"] = await child.reports.get()
    return results


def where_the_time_goes(results: dict[str, Any], child: Child) -> None:
    seen_by_binder: dict[str, float] = results["report"]["seen"]
    by_request: dict[str, dict[str, Any]] = {}
    for record in child.placement_passes:
        for request_id in record.get("answers", ()):
            by_request.setdefault(request_id, record)
    steps: dict[str, list[float]] = {k: [] for k in (
        "write -> binder cache", "cache -> pass start", "snapshot", "plan", "plan_writes", "writes (API)",
        "other in pass", "answer written -> seen here")}
    for request_id, (kind, sent, seen) in results["ids"].items():
        found = by_request.get(request_id)
        if kind != "idle" or found is None or request_id not in seen_by_binder:
            continue
        record, cached = found, seen_by_binder[request_id]
        inside = sum(record.get(k, 0.0) for k in ("snapshot", "plan", "plan_writes", "writes"))
        steps["write -> binder cache"].append(cached - sent)
        steps["cache -> pass start"].append(record["started"] - cached)
        steps["snapshot"].append(record.get("snapshot", 0.0))
        steps["plan"].append(record.get("plan", 0.0))
        steps["plan_writes"].append(record.get("plan_writes", 0.0))
        steps["writes (API)"].append(record.get("writes", 0.0))
        steps["other in pass"].append(record["ended"] - record["started"] - inside)
        steps["answer written -> seen here"].append(seen - record["ended"])
    print("where an idle answer's time goes (median, p99; one monotonic clock for both processes; 'writes' includes"
          " the Event posted after each device write, so the answer is often seen here before it returns):")
    for step, values in steps.items():
        if values:
            print(f"  {step:<30} {statistics.median(values) * 1000:7.2f} ms  {percentile(values, 99) * 1000:7.2f} ms")


async def drive(args: argparse.Namespace) -> None:
    from cozygpu.devcluster import apply, binaries
    from cozygpu.devcluster.plane import ControlPlane
    from tests.support.crds import install_fixture_crd

    size = sizes(args.quick)
    if args.attach:
        plane = ControlPlane.attach(Path(args.attach))
        size = json.loads((Path(args.attach) / "bench_binder.json").read_text())
        size["storm"] = sizes(args.quick)["storm"]
        populated = True
    else:
        if binaries.find(binaries.DEFAULT_MINOR) is None:
            sys.exit("control-plane binaries missing: run `python -m cozygpu.devcluster.binaries` first")
        plane = ControlPlane.start(build=False)
        populated = False
    print(f"control plane {plane.kubernetes_version} in {plane.directory}")
    try:
        async with plane.client() as admin:
            if not populated:
                await apply.install_crds(admin)
                await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
                print(f"populating {size}:")
                await populate(admin, size)
                (plane.directory / "bench_binder.json").write_text(json.dumps(size))
            process = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--binder", str(plane.kubeconfig), *(["--profile"] if args.profile else []),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
                limit=64 * 1024 * 1024)  # the report line carries every request seen, long after --attach
            nodes = resource_path("", "v1", "nodes")

            async def poke() -> str:
                made = await admin.merge_patch(f"{nodes}/node-0",
                                               {"metadata": {"labels": {"poke": uuid.uuid4().hex[:8]}}})
                return str(made["metadata"]["resourceVersion"])

            child = Child(process, poke)
            reader = asyncio.create_task(child.read())
            synced = await asyncio.wait_for(child.synced, timeout=600)
            print(f"binder synced; RSS {synced['rss']:.0f} MB; waiting for its first passes to settle")
            if args.requests:
                size = {**size, "requests": args.requests}
            if args.orders:
                size = {**size, "orders": args.orders}
            results = await measure(admin, child, size, profile=args.profile)
            await child.send(do="stop")
            await asyncio.wait_for(process.wait(), timeout=60)
            reader.cancel()
    finally:
        if not args.keep:
            plane.stop()

    quiet = [p["duration"] * 1000 for p in child.housekeeping_passes if not p["wrote"]]
    print()
    print(f"cluster: {size['nodes']} nodes, {size['nodes'] * GPUS_PER_NODE} GPUs, {size['devices']} devices,"
          f" {size['vmis']} running VMIs")
    for kind in ("idle", "during"):
        values = results[kind]
        p99 = ratio(percentile(values, 99), ANSWER_P99_TARGET_MS)
        print(f"answer latency, {kind:<6}: {summary(values)}   p99 {p99}")
    storm = results["storm"]
    print(f"storm of {len(storm)} at once: {summary(storm)}; last answer {results['storm_total']:.0f} ms after the"
          " first write")
    print(f"housekeeping pass (writing nothing): {summary(quiet)}"
          f"   p50 {ratio(percentile(quiet, 50), HOUSEKEEPING_PASS_TARGET_MS)}")
    parts = {k: statistics.median(p.get(k, 0.0) for p in child.housekeeping_passes if not p["wrote"]) * 1000
             for k in ("snapshot", "plan", "writes")}
    print("  of which (median): " + ", ".join(f"{k} {v:.1f} ms" for k, v in parts.items()))
    orders = results["orders"]
    print(f"new order (create -> Bound seen): {summary(orders)}; bound by lane: {results['order_lanes']}")
    report = results["report"]
    print(f"controller RSS: {report['rss']:.0f} MB (peak {report['peak']:.0f} MB)"
          f"   {ratio(report['rss'], RSS_TARGET_MB)}")
    placement_passes = [p for p in child.placement_passes if p.get("answers")]
    per_pass = [len(p["answers"]) for p in placement_passes]
    print(f"placement passes: {len(placement_passes)} answered {sum(per_pass)} requests (max {max(per_pass)} in one;"
          " the storm's are the big ones)")
    where_the_time_goes(results, child)
    if report.get("profile"):
        print("cProfile of the idle placement passes (cumulative):")
        print(report["profile"])
    if report.get("profile_housekeeping"):
        print("cProfile of five housekeeping passes writing nothing (cumulative):")
        print(report["profile_housekeeping"])
    if args.keep:
        print(f"control plane left running; reuse it with --attach {plane.directory}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tenth of the cluster, 40 requests, 20 orders")
    parser.add_argument("--keep", action="store_true", help="leave the control plane running")
    parser.add_argument("--attach", help="reuse a populated control plane left by --keep")
    parser.add_argument("--profile", action="store_true", help="cProfile the idle placement passes")
    parser.add_argument("--requests", type=int, help="requests one at a time, idle and during (default 200)")
    parser.add_argument("--orders", type=int, help="new orders one at a time (default 50)")
    parser.add_argument("--binder", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.binder:
        import uvloop

        uvloop.run(run_binder(args.binder, profile=args.profile))
    else:
        asyncio.run(drive(args))


if __name__ == "__main__":
    main()
