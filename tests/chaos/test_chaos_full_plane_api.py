"""Chaos on the full plane: faults one after another under a steady stream of orders, starts and stops.

The whole product runs as in a cluster, on loopback: kube-scheduler places the
launcher pods on kwok GPU nodes (each with its GPUNode report), the KubeVirt
stand-in plays virt-controller, and two ``cozygpu controller`` replicas run as
real processes — one leads and binds, both serve the webhooks behind a
Service-like balancer — with all their API traffic through the loopback proxy,
so their watches can be cut. Tenants with budgets on a tree of namespaces
order GPUDevices, give idle holds up, start VMs (VMIs naming held devices) and
stop them; the budgets and the nodes are small, so nodes are often full and
orders are refused.

Phases, each a bounded stream of that work with one fault a third of the way
in: none (the baseline); the API server restarted (same port, etcd and
certificates); every watch of the replicas cut; the leader SIGKILLed (the
"kubelet" here restarts whatever exits, in the same slot, with the same
identity); the leader SIGSTOPped until the other replica leads — longer than
the lease — then SIGCONT. After each, once the binder has decided every order
and every VMI has settled (awaited, never slept for), the API server's state is
audited (``tests/chaos/support.py``): 0 units double-booked, 0 budgets
exceeded, 0 running VMs detached, and, from a watch of every device over the
whole run, 0 holds that left Bound without a reason of their own. With one
replica lost (SIGKILL, SIGSTOP) no order or start is refused for want of a
webhook answer once that replica is out of the balancer's endpoints — a
killed one at once (it refuses connections), a frozen one when its probes
fail — but the calls then in flight on its connections (the API server does
not retry an admission call). Over the whole run, the binder's decision
writes the API server took never interleave between two processes: one
leader's decisions per term, whatever was frozen or killed. The figures are
printed per phase (``pytest -s``); the seed is printed too.

The fourth counter has teeth: run with ``COZYGPU_LAUNCHER_GRACE=1ms`` in the
environment (the replicas read it) and a launcher that is Running before its
VMI's ``activePods`` lists it counts as raw use at once, so a VM starting on a
full node sends a neighbour's hold Lost (or moves it), which this test reports
as holds that left Bound without a reason of their own (CapacityLost), and as
running VMs detached when the hold was the VM's own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import signal
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from cozygpu import keys
from cozygpu.admission.webhooks import configurations
from cozygpu.devcluster import apply, nodes
from cozygpu.devcluster.balancer import Backend, Balancer
from cozygpu.devcluster.kubevirt import KubeVirtStandIn
from cozygpu.devcluster.plane import ADMIN_GROUPS, ADMIN_USER, ControlPlane, free_port
from cozygpu.kube import Client, errors, resource_path
from tests.admission.harness import MUTATING, VALIDATING, ca_bundle, unregister, wait_called
from tests.binder.test_controller_binder_api import serving_cert
from tests.binder.world import World
from tests.chaos.support import (
    DEVICES,
    VMIS,
    Audit,
    Recorder,
    audit,
    decided,
    not_accepted_reason,
    now,
)
from tests.runtime.processes import (
    LEASE_DURATION,
    ControllerProcess,
    ControllerProcesses,
    Line,
    interleaved_decisions,
)
from tests.support.planes import Fleet
from tests.support.proxy import Proxy
from tests.support.tenants import Tenants, make_tenants
from tests.support.waiting import eventually

NODE_UNITS = {"n1": 2, "n2": 2, "n3": 2}  # 6 units; the budgets below add up to 9, so nodes fill up
#: Budgets: the parent's subtree in all, one child's of the class, the other tenant's in all.
PARENT_TOTAL, CHILD_CLASS, OTHER_TOTAL = 5, 2, 4
FAULTS = ("none", "API server restart", "watches cut", "SIGKILL leader", "SIGSTOP leader")
#: Per phase: orders sent, VM starts tried, VM stops, idle holds given up.
ORDERS, STARTS, STOPS, DELETES = 12, 5, 4, 7
#: No phase waits longer than this, in all, for its replicas, its orders' decisions and its VMIs to settle
#: (five phases of it and their streams stay under the test's timeout).
SETTLE_TIMEOUT = 35.0
#: The most replica restarts the run tolerates (two are planned) before it calls it a crash loop.
MAX_RESTARTS = 6
RUN_LABEL = "chaos.gpu.cozystack.io/run"
STARTED, STOPPED = "leader-work-started", "leader-work-stopped"
#: Refusals for want of a webhook answer (``why``).
UNANSWERED = ("WebhookUnreachable", "WebhookTimeout")
#: Seconds a call in flight when a replica is lost may take to fail: later calls must be answered.
IN_FLIGHT = 1.0
NAMESPACES = resource_path("", "v1", "namespaces")


def devices_of(namespace: str) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace)


def vmis_of(namespace: str) -> str:
    return resource_path("kubevirt.io", "v1", "virtualmachineinstances", namespace=namespace)


def why(error: errors.KubeError) -> str:
    """A refusal's reason as the figures show it: the webhook's reason, else what kind of failure."""
    if isinstance(error, errors.ApiError):
        if "failed calling webhook" in error.message:
            return "WebhookUnreachable"
        if "timeout" in error.message.lower() and "webhook" in error.message.lower():
            return "WebhookTimeout"
        return error.reason or f"HTTP{error.status}"
    return "APIUnavailable"


@attrs.define
class Phase:
    """One fault's phase and its figures."""

    index: int
    fault: str
    started: float
    fault_at: float | None = None
    healed_at: float | None = None
    ended: float | None = None
    detail: str = ""
    sent: int = 0
    admitted: list[tuple[str, str]] = attrs.field(factory=list)
    #: When each order was sent (host monotonic time).
    sent_at: dict[tuple[str, str], float] = attrs.field(factory=dict)
    maybe: list[tuple[str, str]] = attrs.field(factory=list)
    refused: collections.Counter[str] = attrs.field(factory=collections.Counter)
    #: Orders and starts refused for want of a webhook answer: (when sent, which).
    unanswered: list[tuple[float, str]] = attrs.field(factory=list)
    #: With one replica lost: from when every webhook call must be answered (its endpoint left, plus the
    #: calls then in flight), and which replica it was.
    answered_from: float | None = None
    victim: str = ""
    not_accepted: collections.Counter[str] = attrs.field(factory=collections.Counter)
    bound: int = 0
    decided: int = 0
    withdrawn: int = 0
    starts: int = 0
    #: Starts whose first hold was on a node with every unit held: a launcher there must not cost a neighbour.
    starts_on_full: int = 0
    started_ok: int = 0
    start_refused: collections.Counter[str] = attrs.field(factory=collections.Counter)
    stops: int = 0
    deletes: int = 0
    restarts: int = 0
    decide_last: float | None = None
    #: The longest an order of the phase waited from its create to the binder's decision.
    slowest: float | None = None
    unsettled: list[str] = attrs.field(factory=list)
    audit: Audit | None = None
    left_bound: list[str] = attrs.field(factory=list)
    #: Holds that left Bound (or their node) with a reason of their own, by reason.
    left_own: collections.Counter[str] = attrs.field(factory=collections.Counter)
    exits: list[str] = attrs.field(factory=list)

    def breaches(self) -> list[str]:
        found = [f"{self.fault}: did not settle: {u}" for u in self.unsettled]
        if self.audit is not None:
            found += [f"{self.fault}: double-booked: {b}" for b in self.audit.double_booked]
            found += [f"{self.fault}: budget exceeded: {b}" for b in self.audit.budgets_exceeded]
            found += [f"{self.fault}: running VM detached: {b}" for b in self.audit.running_detached]
        found += [f"{self.fault}: left Bound without a reason of its own: {b}" for b in self.left_bound]
        if self.answered_from is not None and self.fault_at is not None:
            found += [f"{self.fault}: {what}, sent {sent - self.fault_at:.1f} s after the fault, when {self.victim} "
                      f"was out of the endpoints (a call must then reach the other replica)"
                      for sent, what in self.unanswered if sent > self.answered_from]
        return found


def _last_words(process: ControllerProcess) -> str:
    """The last log line of an exited replica that says something (its message), for the figures."""
    for line in reversed(process.lines):
        if str(line.get("level", "")).lower() in ("error", "critical"):
            said = " ".join(str(line[k]) for k in ("msg", "stage") if line.get(k))
            trace = str(line.get("error") or "").strip().splitlines()  # the traceback: its last line says what
            return f"{said}{': ' + trace[-1] if trace else ''}"[:240]
    return process.raw[-1][:160] if process.raw else "(nothing logged)"


def counted(counter: collections.Counter[str]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in counter.most_common()) or "-"


def table(phases: list[Phase]) -> str:
    headers = ["fault", "orders", "admitted", "refused at admission", "decided", "bound", "not accepted",
               "decide-last s", "slowest s", "starts ok/tried", "on full node", "start refused", "stops", "restarts",
               "left Bound (own reason)", "double-booked", "budgets exceeded", "running detached",
               "left Bound w/o reason"]
    rows = []
    for p in phases:
        a = p.audit
        gone = f" (+{p.withdrawn} gone before seen decided)" if p.withdrawn else ""
        rows.append([p.fault, str(p.sent), str(len(p.admitted)), counted(p.refused), f"{p.decided}{gone}", str(p.bound),
                     counted(p.not_accepted), "-" if p.decide_last is None else f"{p.decide_last:.1f}",
                     "-" if p.slowest is None else f"{p.slowest:.1f}",
                     f"{p.started_ok}/{p.starts}", str(p.starts_on_full), counted(p.start_refused), str(p.stops),
                     str(p.restarts), counted(p.left_own),
                     "?" if a is None else str(len(a.double_booked)),
                     "?" if a is None else str(len(a.budgets_exceeded)),
                     "?" if a is None else str(len(a.running_detached)), str(len(p.left_bound))])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    legend = ("decided: orders the binder bound or kept Pending with a reason (\"not accepted\"); decide-last: from "
              "the fault to the decision of the last order still undecided then or sent after it; slowest: the longest "
              "an order of the phase waited from its create to its decision; on full node: starts whose hold sat "
              "on a node with every unit held; restarts: replicas the kubelet started again")
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([*lines, legend])


class Replicas:
    """Two controller slots, each a real process; the "kubelet" restarts whatever exits, in its slot."""

    def __init__(self, processes: ControllerProcesses, flags: Callable[[str], list[str]]) -> None:
        self.processes = processes
        self.flags = flags
        self.slots: dict[str, ControllerProcess] = {}
        self.restarts = 0
        self.exits: list[str] = []
        self.closing = False
        self._kubelets: list[asyncio.Task[None]] = []

    async def start(self, *identities: str) -> None:
        for identity in identities:
            self.slots[identity] = await self.processes.start(identity, *self.flags(identity))
            self._kubelets.append(asyncio.create_task(self._kubelet(identity), name=f"kubelet {identity}"))

    async def _kubelet(self, identity: str) -> None:
        while True:
            process = self.slots[identity]
            code = await process.proc.wait()
            if self.closing:
                return
            self.exits.append(f"{identity} exited with {code}: "
                              + ("SIGKILLed by the test" if code == -signal.SIGKILL else _last_words(process)))
            self.restarts += 1
            if self.restarts > MAX_RESTARTS:
                raise AssertionError(f"the replicas crash-loop: {self.exits}\n" + "\n".join(process.raw[-20:]))
            self.slots[identity] = await self.processes.start(identity, *self.flags(identity))

    async def close(self) -> None:
        self.closing = True
        for kubelet in self._kubelets:
            kubelet.cancel()
        for kubelet in self._kubelets:
            with contextlib.suppress(asyncio.CancelledError):
                await kubelet
        await self.processes.close()

    def check(self) -> None:
        """Fail at once when a kubelet gave up (a crash loop)."""
        for kubelet in self._kubelets:
            if kubelet.done() and not kubelet.cancelled() and (error := kubelet.exception()) is not None:
                raise error

    @staticmethod
    def _term_open(process: ControllerProcess) -> bool:
        return process.proc.returncode is None and len(process.events(STARTED)) > len(process.events(STOPPED))

    async def term_since(self, since: float, *, exclude: ControllerProcess | None = None,
                         timeout: float = 30.0) -> ControllerProcess:
        """The replica whose term of leader work began after ``since`` (host monotonic time)."""

        async def found() -> ControllerProcess | None:
            self.check()
            for process in self.slots.values():
                if process is exclude or not self._term_open(process):
                    continue
                if float(process.events(STARTED)[-1]["monotonic"]) > since:
                    return process
            return None

        leader: ControllerProcess = await eventually(found, timeout=timeout, interval=0.05,
                                                     what=f"no replica began leading within {timeout:.0f} s:\n"
                                                     + self.tails())
        return leader

    async def leader(self) -> ControllerProcess:
        return await self.term_since(0.0)

    def tails(self) -> str:
        return "\n".join(f"{name}: {line}" for name, p in self.slots.items() for line in p.raw[-6:])


@attrs.define
class Chaos:
    admin: Client
    plane: ControlPlane
    proxy: Proxy
    service: Balancer
    replicas: Replicas
    recorder: Recorder
    tenants: Tenants
    world: World
    rng: random.Random
    #: The device Events already looked at (``Recorder.unmatched_events``).
    events_seen: set[str] = attrs.field(factory=set)

    # -- the tenants' stream --------------------------------------------------------------------------

    async def _pause(self, low: float, high: float) -> None:
        await asyncio.sleep(self.rng.uniform(low, high))  # the stream's pace, not a wait for anything

    async def _our_devices(self) -> list[dict[str, Any]]:
        ours = set(self.tenants.all)
        return [d for d in (await self.admin.list_objects(DEVICES))["items"] if d["metadata"]["namespace"] in ours]

    async def _our_vmis(self) -> list[dict[str, Any]]:
        ours = set(self.tenants.all)
        return [v for v in (await self.admin.list_objects(VMIS))["items"] if v["metadata"]["namespace"] in ours]

    async def orders(self, phase: Phase, fault_go: asyncio.Event) -> None:
        for i in range(ORDERS):
            if i == ORDERS // 3:
                fault_go.set()
            namespace = self.rng.choice(self.tenants.all)
            name = f"o{phase.index}-{i}-{uuid.uuid4().hex[:4]}"
            body = {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": name},
                    "spec": {"className": self.world.gpu_class, "count": self.rng.choice((1, 1, 1, 2))}}
            phase.sent += 1
            phase.sent_at[(namespace, name)] = now()
            try:
                await self.admin.create(devices_of(namespace), body)
                phase.admitted.append((namespace, name))
            except errors.ApiError as error:
                phase.refused[why(error)] += 1
                if why(error) in UNANSWERED:
                    phase.unanswered.append((phase.sent_at[(namespace, name)], f"order {namespace}/{name}: "
                                                                                f"{why(error)}"))
            except errors.KubeError:
                phase.maybe.append((namespace, name))  # no answer: it may have been written; looked up later
            await self._pause(0.2, 0.6)
        fault_go.set()

    async def deletes(self, phase: Phase) -> None:
        """Tenants give up holds they do not run (deleting a held device frees its units once released)."""
        for _ in range(DELETES):
            await self._pause(0.4, 0.9)
            with contextlib.suppress(errors.KubeError):
                idle = [d for d in await self._our_devices()
                        if (d.get("status") or {}).get("phase") in ("Bound", "Lost")
                        and not d["status"].get("attachment") and not d["metadata"].get("deletionTimestamp")]
                if idle:
                    victim = self.rng.choice(idle)
                    await self.admin.delete(f"{devices_of(victim['metadata']['namespace'])}/"
                                            f"{victim['metadata']['name']}")
                    phase.deletes += 1

    async def starts(self, phase: Phase) -> None:
        """VM starts: a VMI naming one or two idle holds of a tenant; the VMI webhook attaches and binds them."""
        for i in range(STARTS):
            await self._pause(0.4, 1.0)
            try:
                everything = await self._our_devices()
            except errors.KubeError:
                continue
            held = [d for d in everything if (d.get("status") or {}).get("phase") == "Bound"]
            idle = [d for d in held if not d["status"].get("attachment") and not d["metadata"].get("deletionTimestamp")]
            if not idle:
                continue
            namespace = self.rng.choice(sorted({d["metadata"]["namespace"] for d in idle}))
            mine = [d for d in idle if d["metadata"]["namespace"] == namespace]
            chosen = self.rng.sample(mine, min(len(mine), self.rng.choice((1, 1, 2))))
            members = [d["metadata"]["name"] for d in chosen]
            node = chosen[0]["status"].get("nodeName")
            if sum(int(d["spec"]["count"]) for d in held if d["status"].get("nodeName") == node) >= \
                    NODE_UNITS.get(str(node).rsplit("-", 1)[0], 0):
                phase.starts_on_full += 1
            name = f"vm{phase.index}-{i}-{uuid.uuid4().hex[:4]}"
            body = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {
                "name": name, "labels": {keys.DEVICE_REFS_LABEL: "true"},
                "annotations": {keys.DEVICE_REFS_ANNOTATION: json.dumps([{"device": m} for m in members])}},
                "spec": {"domain": {"devices": {}, "memory": {"guest": "1Gi"}}}}
            phase.starts += 1
            sent = now()
            try:
                await self.admin.create(vmis_of(namespace), body, timeout=40)
                phase.started_ok += 1
            except errors.KubeError as error:
                phase.start_refused[why(error)] += 1
                if why(error) in UNANSWERED:
                    phase.unanswered.append((sent, f"start of {namespace}/{name}: {why(error)}"))

    async def stops(self, phase: Phase) -> None:
        for _ in range(STOPS):
            await self._pause(0.8, 1.6)
            with contextlib.suppress(errors.KubeError):
                running = [v for v in await self._our_vmis() if (v.get("status") or {}).get("phase") == "Running"
                           and not v["metadata"].get("deletionTimestamp")]
                if running:
                    victim = self.rng.choice(running)
                    await self.admin.delete(f"{vmis_of(victim['metadata']['namespace'])}/"
                                            f"{victim['metadata']['name']}")
                    phase.stops += 1

    # -- the faults -----------------------------------------------------------------------------------

    async def fault(self, phase: Phase) -> None:
        if phase.fault == "none":
            return
        if phase.fault == "API server restart":
            phase.fault_at = now()
            await asyncio.to_thread(self.plane.restart_apiserver)
            phase.healed_at = now()
            phase.detail = f"API server away {phase.healed_at - phase.fault_at:.1f} s"
        elif phase.fault == "watches cut":
            phase.fault_at = phase.healed_at = now()
            cut = self.proxy.cut_watches()
            assert cut > 0, "no watch of the replicas was open to cut"
            phase.detail = f"{cut} watches cut"
        elif phase.fault == "SIGKILL leader":
            victim = await self.replicas.leader()
            phase.fault_at = now()
            await victim.kill()  # the kubelet starts it again in its slot
            # A killed replica refuses connections: the balancer tries the other at once, so only the calls
            # in flight on its connections go unanswered.
            phase.victim, phase.answered_from = victim.identity, phase.fault_at + IN_FLIGHT
            successor = await self.replicas.term_since(phase.fault_at)
            phase.healed_at = now()
            phase.detail = f"killed {victim.identity}; {successor.identity} leads after " \
                           f"{phase.healed_at - phase.fault_at:.1f} s"
        elif phase.fault == "SIGSTOP leader":
            victim = await self.replicas.leader()
            phase.fault_at = now()
            victim.proc.send_signal(signal.SIGSTOP)
            try:
                # Frozen until the other replica leads, which it may only once the lease ran out (counted
                # from when it last saw a renewal, up to a retry period before the freeze), and at least
                # a second longer than the lease: the fault's length, not a wait for something.
                successor = await self.replicas.term_since(phase.fault_at, exclude=victim)
                await asyncio.sleep(max(0.0, phase.fault_at + LEASE_DURATION + 1 - now()))
            finally:
                victim.proc.send_signal(signal.SIGCONT)
            phase.healed_at = now()
            # A frozen replica still accepts connections until its endpoint leaves (its probes fail): calls
            # sent to it before then are lost with it, and none after.
            phase.victim = victim.identity
            phase.answered_from = self._left(victim.identity, phase.fault_at) + IN_FLIGHT
            frozen = phase.healed_at - phase.fault_at
            assert frozen > LEASE_DURATION, f"frozen {frozen:.1f} s, not longer than the {LEASE_DURATION} s lease"
            # Thawed, it finds its term over: it stops leading or ends itself (the kubelet restarts it).
            await eventually(lambda: self._stopped_leading(victim, phase.fault_at or 0.0), timeout=30,
                             interval=0.05, what=f"thawed {victim.identity} neither stopped leading nor exited")
            phase.detail = f"froze {victim.identity} {frozen:.1f} s (lease {LEASE_DURATION:.0f} s); " \
                           f"{successor.identity} led meanwhile; {victim.identity} " \
                           f"{'exited' if victim.proc.returncode is not None else 'stepped down'}"

    def _left(self, endpoint: str, since: float) -> float:
        """When ``endpoint`` left the balancer's endpoints after ``since`` (it must have: its probes fail)."""
        left = [float(e["at"]) for e in self.service.state()["events"]
                if e["endpoint"] == endpoint and not e["ready"] and float(e["at"]) >= since]
        assert left, f"{endpoint} never left the endpoints after the fault"
        return left[0]

    @staticmethod
    async def _stopped_leading(process: ControllerProcess, since: float) -> bool:
        if process.proc.returncode is not None:
            return True
        stops: list[Line] = [line for line in process.events(STOPPED) if float(line["monotonic"]) > since]
        return bool(stops)

    # -- settling and the audit -----------------------------------------------------------------------

    async def settle(self, phase: Phase) -> None:
        """Until both slots run, one leads, every order is decided and every VMI has settled."""

        async def both_serving() -> bool:
            self.replicas.check()
            return len(self.service.ready()) == len(self.replicas.slots)

        async def orders_decided() -> bool:
            with contextlib.suppress(errors.KubeError):
                waiting = [d for d in await self._our_devices()
                           if not d["metadata"].get("deletionTimestamp") and not decided(d)]
                return not waiting
            return False

        stuck: list[str] = []

        async def vmis_settled() -> bool:
            with contextlib.suppress(errors.KubeError):
                pods = {p["metadata"]["uid"]: p for p in (await self.admin.list_objects(
                    resource_path("", "v1", "pods"), params={"labelSelector": "kubevirt.io=virt-launcher"}))["items"]}
                stuck.clear()
                for vmi in await self._our_vmis():
                    status = vmi.get("status") or {}
                    active = [pods.get(uid) for uid in status.get("activePods") or {}]
                    if vmi["metadata"].get("deletionTimestamp"):
                        stuck.append(describe_vmi(vmi, active, "being deleted"))
                    elif status.get("phase") in ("Failed", "Succeeded"):
                        continue
                    elif status.get("phase") != "Running" or not any(
                            p and (p.get("status") or {}).get("phase") == "Running" for p in active):
                        stuck.append(describe_vmi(vmi, active, "not running"))
                return not stuck
            stuck[:] = ["the API server did not answer"]
            return False

        checks: list[tuple[Callable[[], Awaitable[bool]], str]] = [
            (both_serving, "both replicas ready behind the webhook Service"),
            (orders_decided, "every order decided by the binder"),
            (vmis_settled, "every VMI Running on its launcher, or ended"),
        ]
        deadline = now() + SETTLE_TIMEOUT
        await self.replicas.leader()
        for check, what in checks:
            try:
                await eventually(check, timeout=max(deadline - now(), 1.0), what=what)
            except AssertionError:
                phase.unsettled.append(f"{what}: not within the phase's {SETTLE_TIMEOUT:.0f} s to settle"
                                       + "".join(f"\n    {s}" for s in stuck if check is vmis_settled))

    async def account(self, phase: Phase) -> None:
        for namespace, name in phase.maybe:
            with contextlib.suppress(errors.KubeError):
                if await self.admin.get_or_none(f"{devices_of(namespace)}/{name}") is not None:
                    phase.admitted.append((namespace, name))
                    continue
            phase.refused["APIUnavailable"] += 1
        current = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in await self._our_devices()}
        # The last order still undecided when the fault came (or sent after it): how long after the fault it was
        # decided. "-" when every order after the fault was refused at admission, or decided before the fault.
        reference = phase.fault_at if phase.fault_at is not None else phase.started
        last: float | None = None
        for key in phase.admitted:
            device = current.get(key)
            if key in self.recorder.decided_at:
                phase.decided += 1
                waited = self.recorder.decided_at[key] - phase.sent_at[key]
                phase.slowest = max(phase.slowest or 0.0, waited)
                if self.recorder.decided_at[key] >= reference:
                    last = max(last or 0.0, self.recorder.decided_at[key] - reference)
            elif device is None:
                phase.withdrawn += 1
            if device is not None:
                if (device.get("status") or {}).get("phase") == "Bound":
                    phase.bound += 1
                elif (reason := not_accepted_reason(device)) is not None:
                    phase.not_accepted[reason] += 1
        phase.decide_last = last
        phase.audit = await audit(self.admin, namespaces=self.tenants.all,
                                  nodes=[self.world.node_name(s) for s in NODE_UNITS], resource=self.world.resource)

    async def run_phase(self, index: int, fault: str) -> Phase:
        phase = Phase(index=index, fault=fault, started=now())
        restarts, exits = self.replicas.restarts, len(self.replicas.exits)
        fault_go = asyncio.Event()

        async def inject() -> None:
            await fault_go.wait()
            await self.fault(phase)

        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.orders(phase, fault_go))
            tasks.create_task(self.deletes(phase))
            tasks.create_task(self.starts(phase))
            tasks.create_task(self.stops(phase))
            tasks.create_task(inject())
        await self.settle(phase)
        await self.account(phase)
        phase.ended = now()
        phase.left_bound = [t.describe() for t in self.recorder.left_bound_without_reason(phase.started, phase.ended)]
        phase.left_bound += await self.recorder.unmatched_events(self.events_seen)
        phase.left_own = self.recorder.left_bound_with_reason(phase.started, phase.ended)
        phase.exits = self.replicas.exits[exits:]
        phase.restarts = self.replicas.restarts - restarts
        print(f"phase {index} {fault}: {phase.detail or 'no fault'}; {phase.ended - phase.started:.1f} s"
              + "".join(f"\n  replica {e}" for e in phase.exits)
              + "".join(f"\n  ! {b}" for b in phase.breaches()), flush=True)
        return phase


def describe_vmi(vmi: dict[str, Any], launchers: list[dict[str, Any] | None], why: str) -> str:
    """One stuck VMI and its launchers, as the settle check saw them: what a failed run needs to be read."""
    status = vmi.get("status") or {}
    said = [tuple(c.get(k) for k in ("type", "status", "reason", "message")) for c in status.get("conditions") or []]
    parts = [f"VMI {vmi['metadata']['namespace']}/{vmi['metadata']['name']} {why}: phase {status.get('phase')}"
             f", node {status.get('nodeName')}, conditions {said}"]
    for pod in launchers:
        if pod is None:
            parts.append("launcher gone")
            continue
        pod_status = pod.get("status") or {}
        conditions = [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                      for c in pod_status.get("conditions") or []]
        parts.append(f"launcher {pod['metadata']['name']} on {pod['spec'].get('nodeName')}: {pod_status.get('phase')} "
                     f"{conditions} deleting={bool(pod['metadata'].get('deletionTimestamp'))}")
    return "; ".join(parts)


async def declare_budgets(admin: Client, tenants: Tenants, gpu_class: str) -> None:
    budgets = {tenants.parent: {f"requests.{keys.QUOTA_TOTAL}": str(PARENT_TOTAL)},
               tenants.children[0]: {f"requests.{keys.class_quota_key(gpu_class)}": str(CHILD_CLASS)},
               tenants.other: {f"requests.{keys.QUOTA_TOTAL}": str(OTHER_TOTAL)}}
    for namespace, hard in budgets.items():
        await admin.create(resource_path("", "v1", "resourcequotas", namespace=namespace),
                           {"metadata": {"name": keys.TENANT_QUOTA_NAME}, "spec": {"hard": hard}})


def proxy_kubeconfig(proxy: Proxy, path: Path) -> Path:
    """The replicas' kubeconfig: the proxy on plain HTTP (it adds the admin identity upstream)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
        "clusters": [{"name": "proxy", "cluster": {"server": proxy.url}}],
        "users": [{"name": "proxy", "user": {}}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}]}))
    return path


@pytest.mark.timeout(280)
async def test_faults_one_after_another_under_a_stream_of_orders_starts_and_stops_keep_every_promise(
        full_plane: ControlPlane, full_admin: Client, fleet: Fleet, tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    print(f"\nchaos seed {seed}")
    rng = random.Random(seed)
    admin = full_admin
    tag = uuid.uuid4().hex[:8]
    await apply.install_kubevirt_crds(admin)
    tenants = await make_tenants(admin, f"tenant-{tag}", f"tenant-{tag}x", labels={RUN_LABEL: tag})
    world = await World.make(admin, tenants.parent)
    await declare_budgets(admin, tenants, world.gpu_class)
    node_names = [world.node_name(short) for short in NODE_UNITS]
    await fleet(*(nodes.SimNode(world.node_name(s), gpus={world.resource: n}) for s, n in NODE_UNITS.items()))
    for short, units in NODE_UNITS.items():
        await world.node(short, units, create_node=False)
    controller_namespace = f"cozygpu-chaos-{tag}"
    await admin.create(NAMESPACES, {"metadata": {"name": controller_namespace}})
    certs = tmp_path / "certs"
    certs.mkdir()
    serving_cert(full_plane, certs)
    ports = {identity: (free_port(), free_port()) for identity in ("chaos-a", "chaos-b")}

    def flags(identity: str) -> list[str]:
        webhook, health = ports[identity]
        return ["--enable-gpu", "--cert-dir", str(certs), "--webhook-addr", f"127.0.0.1:{webhook}",
                "--health-addr", f"127.0.0.1:{health}", "--attachment-grace", "20s"]

    identity = full_plane.ssl_context(full_plane.identity(ADMIN_USER, ADMIN_GROUPS))
    recorder = Recorder(admin, tenants.all, node_names)
    hooks = f"cozygpu-chaos-{tag}"
    background: list[asyncio.Task[None]] = []
    phases: list[Phase] = []
    async with Proxy(full_plane.host, identity) as proxy, \
            Balancer([Backend(name, "127.0.0.1", webhook, f"http://127.0.0.1:{health}/readyz")
                      for name, (webhook, health) in ports.items()], period=0.5).running() as service:
        replicas = Replicas(ControllerProcesses(proxy_kubeconfig(proxy, tmp_path / "kubeconfig"),
                                                controller_namespace), flags)
        try:
            background.append(asyncio.create_task(recorder.run(), name="recorder"))
            background += [asyncio.create_task(KubeVirtStandIn(admin, namespace=namespace).run(),
                                               name=f"kubevirt {namespace}") for namespace in tenants.all]
            await replicas.start(*ports)

            async def serving() -> bool:
                replicas.check()
                return len(service.ready()) == len(ports)

            try:
                await eventually(serving, timeout=60, what="the replicas never became ready")
            except AssertionError:
                raise AssertionError(f"the replicas never became ready:\n{replicas.tails()}") from None
            validating, mutating = configurations(f"https://{service.address}", ca_bundle(full_plane),
                                                  timeout_seconds=15,
                                                  namespace_selector={"matchLabels": {RUN_LABEL: tag}}, name=hooks)
            await admin.create(VALIDATING, validating)
            await admin.create(MUTATING, mutating)
            await wait_called(admin, tenants.parent)
            await replicas.leader()
            async with asyncio.timeout(30):
                await recorder.synced()
            chaos = Chaos(admin, full_plane, proxy, service, replicas, recorder, tenants, world, rng)
            for index, fault in enumerate(FAULTS):
                for task in background:
                    if task.done():
                        task.result()  # a stand-in or the recorder died: say why
                phases.append(await chaos.run_phase(index, fault))
        finally:
            await unregister(admin, [hooks])
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await replicas.close()
            if phases:
                print("\n" + table(phases))
                print(f"recorder: {len(recorder.transitions)} phase transitions of {len(recorder.decided_at)} "
                      f"decided orders, {recorder.reconnects} watch reconnects, {recorder.relists} relists; "
                      f"webhook connections turned away {service.rejected}")
    breaches = [b for phase in phases for b in phase.breaches()]
    # Never two leaders' decisions in one term, across every fault (the fence, not leader election).
    breaches += [f"leaders: {b}" for b in interleaved_decisions(replicas.processes.started)]
    if breaches:  # what each replica decided and why, for the next reader of a failure
        logs = tmp_path / "replicas.log"
        logs.write_text("".join(f"{process.identity} (process {index}): {line}\n"
                                for index, process in enumerate(replicas.processes.started) for line in process.raw))
        breaches.append(f"every replica's log: {logs}")
    assert not breaches, "\n".join(breaches)
    # The run did what it claims: VMs ran through the faults, nodes filled up and orders were refused for it.
    assert any(p.audit is not None and p.audit.running for p in phases), "no VM ran: nothing was at stake"
    assert sum(p.bound for p in phases) > 0
