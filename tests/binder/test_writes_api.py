"""Placement's writes through the patcher against the real API server: preconditions, sets, Events
(R-BIND-2, R-BIND-4)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import pytest

from cozygpu.binder.patcher import Sent, Write
from cozygpu.binder.recorder import EventRecorder
from cozygpu.binder.status import DeviceWrite, SetWrite, plan_writes
from cozygpu.binder.writes import write_sets
from cozygpu.kube import Client, errors, resource_path
from cozygpu.model.placement import plan_pass
from cozygpu.model.snapshot import Phase, Snapshot
from cozygpu.passes.writes import Writes
from cozygpu.views import specs
from cozygpu.views.decode import device_view
from tests.binder.support import device_path, order, read_all
from tests.model.factories import NOW, gpu_nodes, snapshot


def snap_of(objects: dict[tuple[str, str], dict[str, Any]], *nodes: tuple[str, int]) -> Snapshot:
    node_views, inventories = gpu_nodes(*(nodes or (("n1", 8),)))
    return snapshot(nodes=node_views, inventories=inventories, devices=[device_view(o) for o in objects.values()])


async def write(admin: Client, sets: Sequence[SetWrite], record: Writes | None = None) -> Sent:
    """The sets written, and their Events sent (as the binder's recorder sends them, after the writes)."""
    recorder = EventRecorder(admin, instance="test")

    def written(device: DeviceWrite, version: str) -> None:
        recorder.record(device, version, now=NOW)

    sent = await write_sets(admin, sets, Writes() if record is None else record, on_written=written)
    await recorder.flush()
    return sent


def names(writes: Iterable[Write]) -> list[str]:
    """The devices of the patcher's writes of placement, in order."""
    found = []
    for write in writes:
        assert isinstance(write.tag, DeviceWrite)
        found.append(write.tag.key[1])
    return found


async def events_of(admin: Client, namespace: str, name: str) -> list[tuple[str, str]]:
    listed = await admin.list_objects(resource_path("", "v1", "events", namespace=namespace),
                                      params={"fieldSelector": f"involvedObject.name={name}"})
    return [(e["reason"], e["message"]) for e in listed["items"]]


async def test_an_order_is_bound_with_its_answer_an_event_and_the_version_written(
        admin: Client, namespace: str) -> None:
    await order(admin, namespace, "d1", status={"bindRequest": {"id": "r-1", "vmi": "vm"},
                                                "attachment": {"vmi": "vm"}})
    objects = await read_all(admin, namespace)
    snap = snap_of(objects)
    record = Writes()
    sent = await write(admin, plan_writes(plan_pass(snap), snap, objects, now=NOW), record)
    stored = await admin.get(device_path(namespace, "d1"))
    assert sent.clean
    assert names(w for w, _ in sent.written) == ["d1"]
    assert stored["status"]["phase"] == "Bound"
    assert stored["status"]["nodeName"] == "n1"
    assert stored["status"]["bindAnswer"]["result"] == "Succeeded"
    assert stored["status"]["bindAnswer"]["node"] == "n1"
    assert stored["status"]["observedGeneration"] == 1
    assert dict(record.items()) == {specs.GPU_DEVICES.key: stored["metadata"]["resourceVersion"]}
    assert ("Bound", "bound on node n1") in await events_of(admin, namespace, "d1")


async def test_a_decision_on_a_stale_version_conflicts_and_writes_nothing(admin: Client, namespace: str) -> None:
    await order(admin, namespace, "d1")
    objects = await read_all(admin, namespace)
    snap = snap_of(objects)
    writes = plan_writes(plan_pass(snap), snap, objects, now=NOW)
    # Someone writes the device after the decision was made on it.
    await admin.merge_patch(device_path(namespace, "d1"), {"metadata": {"labels": {"touched": "yes"}}})
    sent = await write(admin, writes)
    stored = await admin.get(device_path(namespace, "d1"))
    assert sent.requeue
    assert names(sent.refused) == ["d1"]
    assert sent.written == ()
    assert stored["status"] == {"phase": "Pending"}, "only the schema's default: nothing was written"
    assert await events_of(admin, namespace, "d1") == []


async def test_a_set_written_half_way_is_gathered_by_the_next_pass(admin: Client, namespace: str) -> None:
    # A VMI's four devices split over two nodes: only n2 has room for all four, so a and c move.
    for name, node in (("a", "n1"), ("b", "n2"), ("c", "n1"), ("d", "n2")):
        await order(admin, namespace, name, status={"phase": "Bound", "nodeName": node,
                                                    "attachment": {"vmi": "vm"}})
    objects = await read_all(admin, namespace)
    snap = snap_of(objects, ("n1", 2), ("n2", 4))
    writes = plan_writes(plan_pass(snap), snap, objects, now=NOW)
    (group,) = writes
    assert [w.key[1] for w in group.devices] == ["a", "c"]
    # The second member changes under the writer: the first is written, the second dropped.
    await admin.merge_patch(device_path(namespace, "c"), {"metadata": {"labels": {"touched": "yes"}}})
    sent = await write(admin, writes)
    assert names(w for w, _ in sent.written) == ["a"]
    assert names(sent.refused) == ["c"]
    assert sent.requeue
    half = await read_all(admin, namespace)
    assert {k[1]: o["status"]["nodeName"] for k, o in half.items()} == {"a": "n2", "b": "n2", "c": "n1", "d": "n2"}
    # The next pass, from the fresh view, restores the set.
    snap = snap_of(half, ("n1", 2), ("n2", 4))
    sent = await write(admin, plan_writes(plan_pass(snap), snap, half, now=NOW))
    after = await read_all(admin, namespace)
    assert sent.clean
    assert {o["status"]["nodeName"] for o in after.values()} == {"n2"}
    assert {o["status"]["phase"] for o in after.values()} == {Phase.BOUND.value}
    assert any(reason == "Gathered" for reason, _ in await events_of(admin, namespace, "c"))


async def test_a_device_gone_before_its_write_drops_its_set(admin: Client, namespace: str) -> None:
    await order(admin, namespace, "d1")
    objects = await read_all(admin, namespace)
    snap = snap_of(objects)
    writes = plan_writes(plan_pass(snap), snap, objects, now=NOW)
    await admin.delete(device_path(namespace, "d1"))
    sent = await write(admin, writes)
    assert names(sent.refused) == ["d1"]
    assert sent.requeue
    assert sent.written == ()
    with pytest.raises(errors.NotFound):  # refused because it is gone, not on a version
        await admin.get(device_path(namespace, "d1"))


async def test_a_dropped_set_stops_the_later_sets_that_counted_on_what_it_would_free(
        admin: Client, namespace: str) -> None:
    # "held" is Bound on a gone node and the plan moves it to n1; "new" takes n2 because the plan booked n1
    # for "held". The plan is one piece: when "held" is dropped, "new" is not written either.
    await order(admin, namespace, "held", count=2, status={"phase": "Bound", "nodeName": "gone"})
    await order(admin, namespace, "new", count=2)
    objects = await read_all(admin, namespace)
    snap = snap_of(objects, ("n1", 2), ("n2", 2))
    writes = plan_writes(plan_pass(snap), snap, objects, now=NOW)
    assert [s.label for s in writes] == [f"GPUDevice {namespace}/held", f"GPUDevice {namespace}/new"]
    await admin.merge_patch(device_path(namespace, "held"), {"metadata": {"labels": {"touched": "yes"}}})
    sent = await write(admin, writes)
    assert names(sent.refused) == ["held"]
    assert names(sent.dropped) == ["new"], "the later set is not sent"
    assert sent.requeue
    assert (await admin.get(device_path(namespace, "new")))["status"] == {"phase": "Pending"}, "nothing written"


class InFlight:
    """The admin client's merge patches, each one's start and end in order (and the most at once)."""

    def __init__(self, admin: Client) -> None:
        self.admin, self.now, self.most = admin, 0, 0
        self.steps: list[tuple[str, str]] = []

    async def merge_patch(self, path: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        name = path.rsplit("/", 2)[-2]
        self.now += 1
        self.most = max(self.most, self.now)
        self.steps.append(("start", name))
        try:
            answer: dict[str, Any] = await self.admin.merge_patch(path, body, **kw)
            return answer
        finally:
            self.now -= 1
            self.steps.append(("end", name))

    def alone(self, name: str) -> bool:
        """``name``'s write started with nothing in flight, and nothing started until it ended."""
        at = self.steps.index(("start", name))
        return (self.steps[at - 1][0] == "end" if at else True) and self.steps[at + 1] == ("end", name)

    def client(self) -> Client:
        return cast(Client, self)


async def test_orders_that_only_take_units_are_written_at_once_and_a_refusal_among_them_stops_no_other(
        admin: Client, namespace: str) -> None:
    for name in ("a", "b", "c", "d"):
        await order(admin, namespace, name)
    objects = await read_all(admin, namespace)
    snap = snap_of(objects, ("n1", 8))
    sets = plan_writes(plan_pass(snap), snap, objects, now=NOW)
    assert [(s.label.rsplit("/", 1)[1], s.takes_only) for s in sets] == [
        ("a", True), ("b", True), ("c", True), ("d", True)]
    await admin.merge_patch(device_path(namespace, "b"), {"metadata": {"labels": {"touched": "yes"}}})
    counted = InFlight(admin)
    sent = await write_sets(counted.client(), sets, Writes())
    assert counted.most == 4, "every write out at once"
    assert names(w for w, _ in sent.written) == ["a", "c", "d"], "in plan order, b's refusal stopping none"
    assert names(sent.refused) == ["b"]
    assert not sent.dropped
    assert sent.requeue
    for name, phase in (("a", "Bound"), ("b", "Pending"), ("c", "Bound"), ("d", "Bound")):
        assert (await admin.get(device_path(namespace, name)))["status"]["phase"] == phase


async def test_a_set_that_frees_units_is_answered_before_a_later_set_is_sent(admin: Client, namespace: str) -> None:
    # "held" moves from a gone node to n1 (it frees what it held); "new" goes to n2, decided after it.
    await order(admin, namespace, "first")
    await order(admin, namespace, "held", count=2, status={"phase": "Bound", "nodeName": "gone"})
    await order(admin, namespace, "new", count=2)
    objects = await read_all(admin, namespace)
    snap = snap_of(objects, ("n1", 2), ("n2", 3))
    sets = plan_writes(plan_pass(snap), snap, objects, now=NOW)
    takes = {s.label.rsplit("/", 1)[1]: s.takes_only for s in sets}
    assert takes == {"first": True, "held": False, "new": True}
    counted = InFlight(admin)
    sent = await write_sets(counted.client(), sets, Writes())
    starts = [name for step, name in counted.steps if step == "start"]
    assert counted.alone("held"), f"the move goes alone, the sets around it wait for its answer: {counted.steps}"
    assert starts == [s.label.rsplit("/", 1)[1] for s in sets], "in plan order"
    assert sorted(names(w for w, _ in sent.written)) == ["first", "held", "new"]
