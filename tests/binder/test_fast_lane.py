"""FastLane's proof, event by event: which changes rank ahead of new orders and which do not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cozygpu.binder.fastlane import FastLane
from cozygpu.cache.frozen import freeze
from cozygpu.cache.store import Event
from cozygpu.model.assemble import assemble
from cozygpu.model.placement import Bind, PassPlan
from cozygpu.model.snapshot import DeviceView, GPUClassView, Mode, Phase
from cozygpu.views import specs

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def device(name: str, *, phase: str | None = None, node: str | None = None, vmi: str | None = None,
           rv: int = 1) -> Any:
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if node:
        status["nodeName"] = node
    if vmi:
        status["attachment"] = {"vmi": vmi, "uid": "u"}
    return freeze({"metadata": {"namespace": "tenant-a", "name": name, "resourceVersion": str(rv)},
                   "spec": {"className": "h100", "count": 1}, "status": status})


def node(name: str, *, cordoned: bool = False, heartbeat: str = "1") -> Any:
    return freeze({"metadata": {"name": name, "labels": {"a": "b"}}, "spec": {"unschedulable": cordoned},
                   "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}]}})


def settled_lane() -> FastLane:
    lane = FastLane(wall=lambda: NOW, report_stale_after=timedelta(minutes=5))
    lane.settle(lane.mark())
    assert lane.settled
    return lane


def modified(kind: str, old: Any, new: Any) -> Event:
    return Event(kind, "MODIFIED", new, old)


def test_new_orders_pending_changes_deletions_and_heartbeats_do_not_rank() -> None:
    lane = settled_lane()
    lane.device(Event("gpudevices", "ADDED", device("new"), None))
    lane.device(modified("gpudevices", device("new"), device("new", vmi="vm", rv=2)))
    lane.device(Event("gpudevices", "DELETED", device("held", phase="Bound", node="n1"),
                      device("held", phase="Bound", node="n1")))
    lane.handlers()[specs.NODES](
        modified("nodes", node("n1"), node("n1", heartbeat="2")))
    assert lane.settled


def test_the_binders_own_placement_does_not_rank_and_another_writers_does() -> None:
    lane = settled_lane()
    views = [DeviceView(namespace="tenant-a", name=n, class_name="h100", count=1) for n in ("mine", "theirs")]
    snapshot = assemble(now=NOW, devices=views, classes=[
        GPUClassView(name="h100", mode=Mode.PASSTHROUGH, resource_name="nvidia.com/X")])
    lane.expect(PassPlan(actions=(Bind(device=("tenant-a", "mine"), node="n1"),)), snapshot, answers=True)
    lane.device(modified("gpudevices", device("mine"), device("mine", phase="Bound", node="n1", rv=2)))
    assert lane.settled, "its own write, as it said it would be"
    lane.device(modified("gpudevices", device("theirs"), device("theirs", phase="Bound", node="n2", rv=2)))
    assert not lane.settled
    assert "another writer" in lane.reason


def test_a_cordon_an_attachment_change_of_a_held_device_and_a_device_appearing_bound_rank() -> None:
    for event in (
        modified("nodes", node("n1"), node("n1", cordoned=True)),
        modified("gpudevices", device("held", phase="Bound", node="n1"),
                 device("held", phase="Bound", node="n1", vmi="vm", rv=2)),
        Event("gpudevices", "ADDED", device("restored", phase=Phase.BOUND.value, node="n1"), None),
    ):
        lane = settled_lane()
        if event.kind == "nodes":
            lane.handlers()[specs.NODES](event)
        else:
            lane.device(event)
        assert not lane.settled, event


def test_a_lost_set_closes_the_lane_only_once_units_of_its_resource_came_free() -> None:
    lane = settled_lane()
    classes = [GPUClassView(name="h100", mode=Mode.PASSTHROUGH, resource_name="nvidia.com/X")]
    lane.device(Event("gpudevices", "ADDED", device("new"), None))
    lane.device(modified("gpudevices", device("lost", phase="Bound", node="n1"), device("lost", phase="Lost", rv=2)))
    lane.settle(lane.mark())  # a full pass found no room for it
    snapshot = assemble(now=NOW, classes=classes, devices=[
        DeviceView(namespace="tenant-a", name="new", class_name="h100", count=1),
        DeviceView(namespace="tenant-a", name="lost", class_name="h100", count=1, phase=Phase.LOST)])
    lane.saw(snapshot)
    assert lane.open(snapshot) == (True, "")
    lane.device(Event("gpudevices", "DELETED", device("gone", phase="Bound", node="n1"),
                      device("gone", phase="Bound", node="n1")))
    is_open, why = lane.open(snapshot)
    assert not is_open
    assert "nvidia.com/X" in why
    lane.settle(lane.mark())  # the next full pass had its chance at that room
    assert lane.open(snapshot) == (True, "")


def test_a_set_split_while_its_vm_runs_closes_the_lane_only_to_orders_of_its_names_once_they_came_free() -> None:
    classes = [GPUClassView(name="h100", mode=Mode.PASSTHROUGH, resource_name="nvidia.com/X")]
    snapshot = assemble(now=NOW, classes=classes, devices=[
        DeviceView(namespace="tenant-a", name="new", class_name="h100", count=1)])
    for waiting, closes in ((["nvidia.com/X"], True), (["nvidia.com/Y"], False)):
        lane = settled_lane()
        lane.device(Event("gpudevices", "ADDED", device("new"), None))
        lane.settle(lane.mark(), waiting=waiting)  # the full pass left a set of these names split
        lane.saw(snapshot)
        assert lane.settled
        assert lane.open(snapshot) == (True, ""), "no room came free since: the split set could not take any"
        lane.device(Event("gpudevices", "DELETED", device("gone", phase="Bound", node="n1"),
                          device("gone", phase="Bound", node="n1")))
        is_open, why = lane.open(snapshot)
        assert is_open is not closes, waiting
        if closes:
            assert "nvidia.com/X" in why
        lane.settle(lane.mark())  # the next full pass gathered it
        assert lane.open(snapshot) == (True, "")
