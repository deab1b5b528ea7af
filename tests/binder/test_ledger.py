"""What the ledger writes into a hold's status (R-LEDGER-1, R-LEDGER-2), and the first bind's heldSince (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import attrs

from cozygpu.binder.ledger import EXPIRING_CONDITION, REASON_EXPIRED, ledger_writes
from cozygpu.binder.status import BOUND_CONDITION, WARNING, plan_writes
from cozygpu.model.placement import plan_pass
from cozygpu.model.snapshot import DeviceView, Ledger, Phase, Snapshot
from cozygpu.views.decode import device_view
from tests.model.factories import NOW, device, gpu_class, gpu_nodes, pod, snapshot, vmi

HOUR = timedelta(hours=1)
STAMP = "%Y-%m-%dT%H:%M:%SZ"


def raw(view: DeviceView, status: Mapping[str, Any], *, rv: str = "7") -> dict[str, Any]:
    return {"metadata": {"namespace": view.namespace, "name": view.name, "uid": f"uid-{view.name}",
                         "resourceVersion": rv, "generation": 1},
            "spec": {"className": view.class_name, "count": view.count},
            "status": {"phase": view.phase.value, "nodeName": view.node_name, **status}}


def world(status: Mapping[str, Any], *, limit: timedelta | None = 10 * HOUR, warning: timedelta = 2 * HOUR,
          running: bool = False) -> tuple[Snapshot, dict[tuple[str, str], dict[str, Any]]]:
    """One stopped (or running) hold of 2 on n0 whose status is ``status``, in a class with that rule."""
    base = device("h", count=2, phase=Phase.BOUND, node="n0", vmi="vm" if running else None)
    obj = raw(base, status)
    if running:
        obj["status"]["attachment"] = {"vmi": "vm", "uid": "u"}
    view = device_view(obj)
    nodes, inventories = gpu_nodes(("n0", 4))
    cls = attrs.evolve(gpu_class(), idle_hold_limit=limit, idle_hold_warning=warning)
    extra: dict[str, Any] = {}
    if running:
        extra = {"vmis": [vmi("vm", uid="u", active=["uid-l"])],
                 "pods": [pod("l", node_name="n0", uid="uid-l", claims_vmi=("tenant-a", "vm"))]}
    snap = snapshot(classes=[cls], nodes=nodes, inventories=inventories, devices=[view], **extra)
    return snap, {view.key: obj}


def since(hours: float) -> str:
    return (NOW - timedelta(hours=hours)).strftime(STAMP)


def only(snap: Snapshot, objs: Mapping[tuple[str, str], Mapping[str, Any]]) -> Mapping[str, Any] | None:
    found = ledger_writes(snap, objs, objs.keys(), now=NOW)
    assert len(found) <= 1
    return found[0].status if found else None


def test_the_first_bind_says_held_and_idle_since_then() -> None:
    snap = snapshot(devices=[device("d1")])
    (group,) = plan_writes(plan_pass(snap), snap, {("tenant-a", "d1"): raw(device("d1"), {})}, now=NOW)
    status = group.devices[0].status
    assert (status["heldSince"], status["idleSince"], status["idleSeconds"]) == (since(0), since(0), 0)


def test_a_hold_already_saying_its_ledger_gets_no_write() -> None:
    snap, objs = world({"heldSince": since(3), "idleSince": since(1), "idleSeconds": 60})
    assert only(snap, objs) is None


def test_a_running_vm_closes_the_idle_period_into_idle_seconds() -> None:
    snap, objs = world({"heldSince": since(3), "idleSince": since(1), "idleSeconds": 60}, running=True)
    assert only(snap, objs) == {"heldSince": since(3), "idleSince": None, "idleSeconds": 3660}


def test_a_hold_idle_past_the_warning_is_warned_once_with_the_time_of_its_release() -> None:
    snap, objs = world({"heldSince": since(9), "idleSince": since(9)})
    status = only(snap, objs)
    assert status is not None
    [condition] = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (EXPIRING_CONDITION, "True",
                                                                              "IdleHoldLimit")
    assert condition["message"] == (f"idle since {since(9)}: its 2 units will be released at {since(-1)} (class h100's "
                                    "idleHoldLimit 10h); start its VM before then to keep them")
    [event] = ledger_writes(snap, objs, objs.keys(), now=NOW)[0].events
    assert (event.type, event.reason) == (WARNING, EXPIRING_CONDITION)
    objs[("tenant-a", "h")]["status"]["conditions"] = status["conditions"]
    assert only(snap, objs) is None, "warned already: no second write, no second Event"


def test_past_the_limit_the_hold_is_released_with_its_idle_time_counted() -> None:
    snap, objs = world({"heldSince": since(12), "idleSince": since(11), "idleSeconds": 100})
    status = only(snap, objs)
    assert status is not None
    assert (status["phase"], status["nodeName"], status["idleSince"], status["idleSeconds"]) == (
        "Released", None, None, 100 + 11 * 3600)
    [condition] = [c for c in status["conditions"] if c["type"] == BOUND_CONDITION]
    assert (condition["status"], condition["reason"]) == ("False", REASON_EXPIRED)
    assert condition["message"] == ("released after 11h idle (class h100's idleHoldLimit 10h): its 2 units on node "
                                    "n0 are free and its budget is no longer used; order again to hold GPUs")


def test_a_running_hold_is_never_released_and_a_started_vm_clears_the_warning() -> None:
    warned = {"type": EXPIRING_CONDITION, "status": "True", "reason": "IdleHoldLimit", "message": "m",
              "lastTransitionTime": since(1)}
    snap, objs = world({"heldSince": since(30), "idleSince": since(20), "conditions": [warned]}, running=True)
    status = only(snap, objs)
    assert status is not None
    assert "phase" not in status, "still Bound"
    assert status["conditions"] == []
    assert status["idleSince"] is None


def test_a_released_device_leaves_the_read_model_and_frees_its_units() -> None:
    snap, objs = world({"heldSince": since(12), "idleSince": since(11)})
    status = only(snap, objs)
    assert status is not None
    released = device_view({**objs[("tenant-a", "h")], "status": {**objs[("tenant-a", "h")]["status"], **status}})
    assert released.phase is Phase.RELEASED
    nodes, inventories = gpu_nodes(("n0", 4))
    after = snapshot(nodes=nodes, inventories=inventories, devices=[released])
    assert after.devices == {}
    assert after.availability["h100"].free_in_cluster == 4
    assert released.ledger == Ledger(held_since=NOW - 12 * HOUR, idle_seconds=11 * 3600.0)
