"""The hold ledger on the full plane (R-LEDGER-1, R-LEDGER-2): real kube-scheduler, kwok and the KubeVirt stand-in.

- Expiry: a class releases holds idle for 40 s and warns 25 s before. Three
  holds under a budget of three: ``idle`` (no VM ever), ``kept`` (its VM
  started once it was warned) and ``running`` (its VM started at once), and a
  fourth order ``late`` waiting for the budget. ``idle`` is warned, then
  released (its Events say so); ``late`` is then Bound on the freed budget;
  ``kept`` keeps its hold with the warning gone; ``running`` is never warned.
- Across a leader kill (two controller processes, SIGKILL): a hold's
  ``idleSince`` appears when its VM stops and goes when it starts, written by
  whichever replica leads, and the per-hold counters the survivor exports go
  on from what the killed leader exported (no reset, no double count).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from cozygpu import keys
from cozygpu.binder.ledger import EXPIRING_CONDITION, REASON_EXPIRED
from cozygpu.devcluster import nodes
from cozygpu.devcluster.kubevirt import KubeVirtStandIn
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, Obj, resource_path
from tests.binder.support import VMI_CRD, VMIS, class_path, device_path
from tests.binder.test_controller_binder_api import serving_cert
from tests.binder.world import World, driven_binder
from tests.runtime.processes import ControllerProcess, ControllerProcesses
from tests.runtime.scraping import metrics_reader_token
from tests.runtime.test_controller_handover import first_leader
from tests.support.crds import install_fixture_crd
from tests.support.planes import Fleet
from tests.support.waiting import eventually

NAMESPACES = "/api/v1/namespaces"


def vmis(namespace: str, name: str | None = None) -> str:
    return resource_path(*VMIS, namespace=namespace, name=name)


def vmi_body(name: str, resource: str) -> Obj:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": name},
            "spec": {"domain": {"devices": {"gpus": [{"name": "gpu0", "deviceName": resource}]},
                                "memory": {"guest": "1Gi"}}}}


async def tenant_world(admin: Client, fleet: Fleet, units: int) -> World:
    for crd in ("virtualmachines.kubevirt.io", VMI_CRD):  # the stand-in reads VMs too
        await install_fixture_crd(admin, crd)
    namespace = f"tenant-l{uuid.uuid4().hex[:8]}"
    await admin.create(NAMESPACES, {"metadata": {"name": namespace}})
    world = await World.make(admin, namespace)
    await fleet(nodes.SimNode(world.node_name("gpu"), gpus={world.resource: units}))
    await world.node("gpu", units, create_node=False)
    return world


def status(device: Obj) -> dict[str, Any]:
    return dict(device.get("status") or {})


def condition(device: Obj, kind: str) -> dict[str, Any] | None:
    return next((dict(c) for c in status(device).get("conditions") or () if c.get("type") == kind), None)


async def start_vm(admin: Client, world: World, device: str, vmi: str) -> None:
    """What the VMI webhook and virt-controller do for a start naming ``device``: attach, then the VMI."""
    await admin.merge_patch(device_path(world.namespace, device, status=True),
                            {"status": {"attachment": {"vmi": vmi}}})
    await admin.create(vmis(world.namespace), vmi_body(vmi, world.resource))

    async def running() -> bool:
        found = (await admin.get(vmis(world.namespace, vmi))).get("status") or {}
        return found.get("phase") == "Running" and bool(found.get("activePods"))

    await eventually(running, timeout=60, what=f"VMI {vmi} running on its launcher")


async def stop_vm(admin: Client, world: World, device: str, vmi: str) -> None:
    """A stop: the VMI deleted, its launcher gone, the attachment cleared (as the binder does once it is gone)."""
    await admin.delete(vmis(world.namespace, vmi))

    async def gone() -> bool:
        return await admin.get_or_none(vmis(world.namespace, vmi)) is None

    await eventually(gone, timeout=60, what=f"VMI {vmi} gone")


async def events_of(admin: Client, namespace: str, name: str) -> list[str]:
    listed = await admin.list_objects(resource_path("", "v1", "events", namespace=namespace),
                                      params={"fieldSelector": f"involvedObject.name={name}"})
    return [e.get("reason", "") for e in listed["items"]]


async def test_an_idle_hold_is_warned_then_released_freeing_its_budget_and_a_vm_started_in_time_keeps_its_own(
        full_plane: ControlPlane, full_admin: Client, fleet: Fleet) -> None:
    admin = full_admin
    world = await tenant_world(admin, fleet, 4)
    await admin.merge_patch(class_path(world.gpu_class), {"spec": {"idleHoldLimit": "40s", "idleHoldWarning": "25s"}})
    await admin.create(resource_path("", "v1", "resourcequotas", namespace=world.namespace), {
        "metadata": {"name": keys.TENANT_QUOTA_NAME}, "spec": {"hard": {f"requests.{keys.QUOTA_TOTAL}": "3"}}})
    async with driven_binder(admin, timedelta(seconds=10)), asyncio.TaskGroup() as tasks:
        standin = tasks.create_task(KubeVirtStandIn(admin, namespace=world.namespace).run())
        for name in ("running", "kept", "idle"):
            await world.order(name)

        async def bound(name: str) -> Obj | None:
            device = await world.device(name)
            return device if status(device).get("phase") == "Bound" and status(device).get("heldSince") else None

        for name in ("running", "kept", "idle"):
            await eventually(functools.partial(bound, name), timeout=30, what=f"{name} Bound with heldSince")
        await start_vm(admin, world, "running", "vm-running")
        await world.order("late")

        async def refused_for_budget() -> bool:
            found = condition(await world.device("late"), "Bound")
            return found is not None and found["reason"] == "BudgetExceeded"

        await eventually(refused_for_budget, what="the fourth order waiting for the budget of three")

        async def warned(name: str) -> dict[str, Any] | None:
            return condition(await world.device(name), EXPIRING_CONDITION)

        try:
            kept_warning = await eventually(lambda: warned("kept"), timeout=40, what="kept warned")
        except AssertionError:
            held = {name: status(await world.device(name)) for name in ("running", "kept", "idle", "late")}
            raise AssertionError(f"kept never warned; the holds: {held}") from None
        assert "will be released at" in kept_warning["message"]
        await start_vm(admin, world, "kept", "vm-kept")
        idle_warning = await eventually(lambda: warned("idle"), timeout=40, what="idle warned")
        idle_since = datetime.fromisoformat(status(await world.device("idle"))["idleSince"].replace("Z", "+00:00"))
        assert f"released at {(idle_since + timedelta(seconds=40)).strftime('%Y-%m-%dT%H:%M:%SZ')}" \
               in idle_warning["message"]

        async def released() -> Obj | None:
            device = await world.device("idle")
            return device if status(device).get("phase") == "Released" else None

        gone = await eventually(released, timeout=60, what="idle released past its limit")
        bound_condition = condition(gone, "Bound")
        assert bound_condition is not None
        assert bound_condition["reason"] == REASON_EXPIRED
        assert "nodeName" not in status(gone)
        assert status(gone)["idleSeconds"] >= 40
        await eventually(lambda: bound("late"), timeout=30, what="the waiting order Bound on the freed budget")
        reasons = await eventually(lambda: _both(admin, world.namespace, "idle"), what="idle's two Events")
        assert {EXPIRING_CONDITION, REASON_EXPIRED} <= set(reasons)
        for name in ("kept", "running"):
            device = await world.device(name)
            assert status(device)["phase"] == "Bound"
            assert "idleSince" not in status(device), f"{name}: its VM runs"
            assert condition(device, EXPIRING_CONDITION) is None
        assert EXPIRING_CONDITION not in await events_of(admin, world.namespace, "running")
        standin.cancel()


async def _both(admin: Client, namespace: str, name: str) -> list[str] | None:
    reasons = await events_of(admin, namespace, name)
    return reasons if {EXPIRING_CONDITION, REASON_EXPIRED} <= set(reasons) else None


# -- across a leader kill ---------------------------------------------------------------------------------------


def metrics_port(process: ControllerProcess) -> int | None:
    for line in process.lines:
        if line.get("msg") == "serving" and line.get("server") == "metrics":
            return int(str(line["address"]).rsplit(":", 1)[1])
    return None


async def hold_counters(process: ControllerProcess, token: str, namespace: str, name: str) -> dict[str, float]:
    """The hold's unit-seconds (held, idle) as ``process`` exports them now."""
    port = metrics_port(process)
    assert port is not None, f"{process.identity} logged no metrics address"
    async with aiohttp.ClientSession() as session, session.get(
            f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}, ssl=False) as resp:
        assert resp.status == 200, await resp.text()
        text = await resp.text()
    return {sample.labels["state"]: sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "cozygpu_hold_unit_seconds_total" and sample.labels.get("namespace") == namespace
            and sample.labels.get("gpudevice") == name}


@contextlib.asynccontextmanager
async def replicas(plane: ControlPlane, admin: Client, tmp_path: Path) -> AsyncIterator[ControllerProcesses]:
    namespace = f"ctl-{uuid.uuid4().hex[:8]}"
    await admin.create(NAMESPACES, {"metadata": {"name": namespace}})
    serving_cert(plane, tmp_path)
    processes = ControllerProcesses(plane.kubeconfig, namespace)
    try:
        yield processes
    finally:
        await processes.close()


async def test_idle_since_follows_the_vm_across_a_leader_kill_and_the_counters_go_on(
        full_plane: ControlPlane, full_admin: Client, fleet: Fleet, tmp_path: Path) -> None:
    admin = full_admin
    world = await tenant_world(admin, fleet, 2)
    token = await metrics_reader_token(full_plane, admin, world.namespace)
    async with replicas(full_plane, admin, tmp_path) as processes, asyncio.TaskGroup() as tasks:
        flags = ("--enable-gpu", "--cert-dir", str(tmp_path), "--webhook-addr", "127.0.0.1:0")
        a, b = await processes.start("a", *flags), await processes.start("b", *flags)
        leader = await first_leader(a, b)
        survivor = b if leader is a else a
        standin = tasks.create_task(KubeVirtStandIn(admin, namespace=world.namespace).run())
        await world.order("d", 2)

        async def ledger(idle: bool) -> dict[str, Any] | None:
            found = status(await world.device("d"))
            ok = found.get("phase") == "Bound" and found.get("heldSince") and bool(found.get("idleSince")) == idle
            return found if ok else None

        first = await eventually(lambda: ledger(True), timeout=30, what="d Bound and idle")
        await start_vm(admin, world, "d", "vm")
        running = await eventually(lambda: ledger(False), timeout=30, what="idleSince gone once the VM runs")
        assert running["heldSince"] == first["heldSince"]
        await eventually(lambda: hold_counters(leader, token, world.namespace, "d"), what="the leader's counters")
        before_from = datetime.now(UTC)
        before = await hold_counters(leader, token, world.namespace, "d")
        before_at = datetime.now(UTC)

        await leader.kill()
        await survivor.wait_event("leader-work-started", timeout=60)
        await stop_vm(admin, world, "d", "vm")
        stopped = await eventually(lambda: ledger(True), timeout=60, what="idleSince back, by the new leader")
        assert stopped["heldSince"] == first["heldSince"], "held since the first bind, whoever leads"
        assert stopped["idleSeconds"] == running["idleSeconds"], "the idle period ended at the start is counted once"
        after_from = datetime.now(UTC)
        after = await hold_counters(survivor, token, world.namespace, "d")
        after_to = datetime.now(UTC)
        held_gap = after["held"] - before["held"]
        # Two units held all along: the counter went on by twice the time between the two scrapes, no more (a
        # double count), no less (a reset), whichever replica made each figure.
        shortest, longest = (after_from - before_at).total_seconds(), (after_to - before_from).total_seconds()
        assert 2 * shortest - 0.01 <= held_gap <= 2 * longest + 0.01
        assert after["idle"] >= before["idle"], "no reset"

        await start_vm(admin, world, "d", "vm-2")
        again = await eventually(lambda: ledger(False), timeout=30, what="idleSince gone again")
        opened = datetime.fromisoformat(stopped["idleSince"].replace("Z", "+00:00"))
        # The stopped period (from idleSince to when the binder saw the VM run, in whole seconds) is added once.
        assert running["idleSeconds"] <= again["idleSeconds"] <= \
            running["idleSeconds"] + (datetime.now(UTC) - opened).total_seconds() + 1
        standin.cancel()
