"""The placement cycle, against the real API server over a real cache (R-BIND-3, R-BIND-5).

A new order or a bind request asks for the answer lane the moment it is
seen, and is decided in that very cycle: a cycle is R-BIND-5 in order over
the sets whose inputs changed, so whatever ranks ahead of a new order (a Lost
set that room came back for, a set that must leave a cordoned node) is
decided first, in the same cycle, and the order gets only what is left.
"""

from __future__ import annotations

from typing import Any

import pytest

from cozygpu.kube import errors
from cozygpu.views import specs
from tests.binder.support import device_path
from tests.binder.world import GPUNODES, NODES, RunningBinder, World, cache_until, seen_by


def placement(device: dict[str, Any]) -> tuple[str, str | None]:
    status = device.get("status") or {}
    return status.get("phase") or "Pending", status.get("nodeName")


async def test_a_new_order_is_bound_by_the_very_next_cycle_onto_the_fullest_node_with_room(
        world: World, binder: RunningBinder) -> None:
    await world.node("n-a", 4)
    await world.node("n-b", 4)
    await world.order("held", 1, status=world.held("n-a"))
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("held"))
    requests: list[str] = []
    binder.binder.on_request(lambda: requests.append("answer lane"))
    await binder.each_lane()
    # Heartbeats change no view a placement reads: the kubelet's Ready condition, the agent's report.
    await world.set_ready("n-a", True)
    await world.report("n-a", 4)
    await seen_by(binder, specs.GPU_NODES.key, await world.admin.get(f"{GPUNODES}/{world.node_name('n-a')}"))
    await seen_by(binder, specs.NODES.key, await world.admin.get(f"{NODES}/{world.node_name('n-a')}"))
    asked = len(requests)

    made = await world.order("new", 2)
    await seen_by(binder, specs.GPU_DEVICES.key, made)
    assert len(requests) == asked + 1, "the new order asks for the answer lane at once"

    await binder.placement_pass()

    # The fullest node with room, as the full pass would choose: n-a (3 free) before n-b (4 free).
    assert placement(await world.device("new")) == ("Bound", world.node_name("n-a"))
    assert binder.metrics.decisions.labels(lane="placement", action="Bind")._value.get() >= 1


async def test_a_lost_set_that_room_came_back_for_is_rebound_before_a_new_order_in_the_same_cycle(
        world: World, binder: RunningBinder) -> None:
    await world.node("n-a", 2)
    await world.order("blocker", 2, status=world.held("n-a"))
    await world.order("lost", 2, status={"phase": "Lost"})
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("lost"))
    await binder.each_lane()  # no room: "lost" stays Lost; the finalizers are on
    assert placement(await world.device("lost")) == ("Lost", None)

    # The blocker goes: its finalizer is released by a full pass, and its units with it.
    await world.admin.delete(device_path(world.namespace, "blocker"))
    def blocker_deleting() -> bool:
        blocker = binder.cache.store(specs.GPU_DEVICES).get(world.namespace, "blocker")
        return blocker is not None and bool(blocker["metadata"].get("deletionTimestamp"))

    await cache_until(binder, specs.GPU_DEVICES, blocker_deleting)
    await binder.each_lane()
    with pytest.raises(errors.NotFound):
        await world.device("blocker")
    await cache_until(binder, specs.GPU_DEVICES,
                      lambda: binder.cache.store(specs.GPU_DEVICES).get(world.namespace, "blocker") is None)

    made = await world.order("new", 1)
    await seen_by(binder, specs.GPU_DEVICES.key, made)
    await binder.placement_pass()
    # R-BIND-5 in the one cycle: the Lost set is rebound first and takes the room; the new order waits.
    assert placement(await world.device("lost")) == ("Bound", world.node_name("n-a"))
    assert placement(await world.device("new")) == ("Pending", None)


async def test_a_set_leaving_a_cordoned_node_takes_the_room_before_a_new_order_in_the_same_cycle(
        world: World, binder: RunningBinder) -> None:
    await world.node("n-a", 2)
    await world.node("n-b", 2)
    await world.order("held", 2, status=world.held("n-a"))
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("held"))
    requests: list[str] = []
    binder.binder.on_request(lambda: requests.append("answer lane"))
    await binder.each_lane()

    # n-a is cordoned: its set must move to n-b, the only other room, before any new order takes it.
    cordoned = await world.admin.merge_patch(f"{NODES}/{world.node_name('n-a')}", {"spec": {"unschedulable": True}})
    await seen_by(binder, specs.NODES.key, cordoned)
    asked = len(requests)
    made = await world.order("new", 2)
    await seen_by(binder, specs.GPU_DEVICES.key, made)

    assert len(requests) == asked + 1, "the new order asks for the answer lane at once"
    await binder.placement_pass()
    assert placement(await world.device("held")) == ("Bound", world.node_name("n-b")), "the move off n-a first"
    assert placement(await world.device("new")) == ("Pending", None)
