"""What a plan writes into device status, and which Events it raises (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cozygpu.binder.status import BOUND_CONDITION, NORMAL, WARNING, plan_writes
from cozygpu.model import refusals
from cozygpu.model.placement import Bind, MarkLost, PassPlan, plan_pass
from cozygpu.model.snapshot import DeviceView, Phase, Snapshot
from tests.model.factories import NOW, device, gpu_nodes, node, snapshot


def raw(view: DeviceView, *, status: Mapping[str, Any] | None = None, rv: str = "7") -> dict[str, Any]:
    return {"metadata": {"namespace": view.namespace, "name": view.name, "uid": f"uid-{view.name}",
                         "resourceVersion": rv, "generation": 1},
            "status": dict(status or {})}


def objects(snap: Snapshot, **status: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {key: raw(view, status=status.get(view.name)) for key, view in snap.devices.items()}


def bound(status: Mapping[str, Any]) -> Mapping[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == BOUND_CONDITION)


def test_a_new_bind_writes_phase_node_condition_and_generation_on_the_version_it_was_decided_on() -> None:
    snap = snapshot(devices=[device("d1", count=2)])
    (group,) = plan_writes(plan_pass(snap), snap, objects(snap), now=NOW)
    (write,) = group.devices
    assert write.resource_version == "7"
    assert write.status["phase"] == "Bound"
    assert write.status["nodeName"] == "n1"
    assert write.status["observedGeneration"] == 1
    assert bound(write.status)["status"] == "True"
    assert bound(write.status)["reason"] == "Bound"
    assert [(e.type, e.reason) for e in write.events] == [(NORMAL, "Bound")]


def test_an_answer_names_the_node_and_the_request() -> None:
    snap = snapshot(devices=[device("d1", request="r-1", vmi="vm")])
    (group,) = plan_writes(plan_pass(snap, answers_only=True), snap, objects(snap), now=NOW)
    answer = group.devices[0].status["bindAnswer"]
    assert answer["id"] == "r-1"
    assert answer["result"] == "Succeeded"
    assert answer["node"] == "n1"
    assert answer["time"] == "2026-12-02T12:00:00Z"


def test_an_order_that_cannot_be_accepted_is_pending_and_says_why_in_a_condition_and_an_event() -> None:
    snap = snapshot(devices=[device("big", count=9)])
    (group,) = plan_writes(plan_pass(snap), snap, objects(snap), now=NOW)
    (write,) = group.devices
    assert write.status["phase"] == "Pending"
    condition = bound(write.status)
    assert condition["status"] == "False"
    assert condition["reason"] == "NoNodeWithRoom"
    assert "9 of" in condition["message"]
    assert [(e.type, e.reason) for e in write.events] == [(WARNING, "NotAccepted")]


def test_a_decision_already_written_is_not_written_again() -> None:
    snap = snapshot(devices=[device("big", count=9)])
    (first,) = plan_writes(plan_pass(snap), snap, objects(snap), now=NOW)
    again = objects(snap, big=first.devices[0].status)
    assert plan_writes(plan_pass(snap), snap, again, now=NOW) == ()


def test_a_device_moved_off_a_gone_node_says_from_to_and_why() -> None:
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 8))
    snap = snapshot(nodes=[nodes[1]], inventories=inventories,
                    devices=[device("d1", phase=Phase.BOUND, node="n1")])
    (group,) = plan_writes(plan_pass(snap), snap, objects(snap), now=NOW)
    (write,) = group.devices
    assert write.status["nodeName"] == "n2"
    assert bound(write.status)["reason"] == "Moved"
    assert "from node n1 to node n2" in write.events[0].message


def test_a_device_with_no_room_anywhere_goes_lost_and_loses_its_node() -> None:
    snap = snapshot(nodes=[node("n1", ready=False)], inventories=gpu_nodes(("n1", 8))[1],
                    devices=[device("d1", phase=Phase.BOUND, node="n1")])
    (group,) = plan_writes(plan_pass(snap), snap, objects(snap), now=NOW)
    (write,) = group.devices
    assert write.status["phase"] == "Lost"
    assert write.status["nodeName"] is None
    assert bound(write.status)["reason"] == "Lost"
    assert [(e.type, e.reason) for e in write.events] == [(WARNING, "Lost")]


def test_the_members_of_a_set_are_written_as_one_group() -> None:
    nodes, inventories = gpu_nodes(("n1", 1), ("n2", 4))
    snap = snapshot(nodes=nodes, inventories=inventories, devices=[
        device("a", phase=Phase.BOUND, node="n1", vmi="vm"),
        device("b", phase=Phase.BOUND, node="n2", vmi="vm"),
        device("solo", count=1, created=NOW),
    ])
    groups = plan_writes(plan_pass(snap), snap, objects(snap), now=NOW)
    labels = [g.label for g in groups]
    assert labels[0] == "VMI tenant-a/vm"
    assert {w.key for w in groups[0].devices} == {("tenant-a", "a")}
    assert groups[0].devices[0].status["nodeName"] == "n2"
    assert bound(groups[0].devices[0].status)["reason"] == "Gathered"


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    earlier = {"conditions": [{"type": "Bound", "status": "False", "reason": "BudgetExceeded", "message": "x",
                               "lastTransitionTime": "2026-01-01T00:00:00Z"}, {"type": "Other", "status": "True"}]}
    snap = snapshot(devices=[device("big", count=9)])
    (group,) = plan_writes(plan_pass(snap), snap, objects(snap, big=earlier), now=NOW)
    conditions = group.devices[0].status["conditions"]
    assert bound(group.devices[0].status)["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert {"type": "Other", "status": "True"} in conditions


def test_a_set_sent_lost_for_want_of_room_to_gather_then_placed_in_the_same_plan_says_it_gathered() -> None:
    """Restore finds no node for a split set and sends it Lost; the answer to its start then finds one (the
    members' own units freed): the API server sees a move that gathers the set, and the condition says so —
    not 'Moved' with the room it lacked a moment before (the chaos audit counted that as a move without a
    reason of its own). A loss for a reason of its own (capacity lost) stays the move's cause."""
    snap = snapshot(devices=[device("d1", phase=Phase.BOUND, node="n2", vmi="vm"),
                             device("d2", phase=Phase.BOUND, node="n3", vmi="vm")],
                    nodes=[node("n1"), node("n2"), node("n3")])
    key = ("tenant-a", "d1")
    no_room = refusals.no_node_for_set("VMI tenant-a/vm", needs="2 of nvidia.com/X", candidates=3)
    plan = PassPlan(actions=(MarkLost(device=key, previous="n2", cause=no_room), Bind(device=key, node="n1")))
    (group,) = plan_writes(plan, snap, objects(snap), now=NOW)
    condition = bound(group.devices[0].status)
    assert condition["reason"] == "Gathered"
    assert condition["message"] == "moved from node n2 to node n1 to join the rest of VMI tenant-a/vm"
    lost = refusals.capacity_lost("n2", resource_name="nvidia.com/X", served=1, in_use=2)
    plan = PassPlan(actions=(MarkLost(device=key, previous="n2", cause=lost), Bind(device=key, node="n1")))
    (group,) = plan_writes(plan, snap, objects(snap), now=NOW)
    condition = bound(group.devices[0].status)
    assert (condition["reason"], condition["message"]) == ("Moved", f"moved from node n2 to node n1: {lost.message}")
