"""The fast lane for new orders, against the real API server over a real cache (issue 10 §1).

A new order is bound by an answer pass, with no full pass, only when nothing
ranks ahead of it: the last full pass settled, no event since could make a
held set move, and no Lost set waits for room of its resource. Otherwise the
answer pass leaves it Pending and the full pass binds it in R-BIND-5's order.
"""

from __future__ import annotations

from typing import Any

import pytest

from cozygpu.kube import errors
from cozygpu.views import specs
from tests.binder.support import device_path
from tests.binder.world import GPUNODES, NODES, RunningBinder, World, cache_until, seen_by


async def settled_full_pass(binder: RunningBinder) -> None:
    """Full passes until one settles (what earlier tests left in the shared plane may take one more)."""
    for _ in range(3):
        await binder.full_pass()
        if binder.binder.fast_lane.settled:
            return
    raise AssertionError(f"no full pass settled: {binder.binder.fast_lane.reason}")


def placement(device: dict[str, Any]) -> tuple[str, str | None]:
    status = device.get("status") or {}
    return status.get("phase") or "Pending", status.get("nodeName")


async def test_a_new_order_is_bound_by_the_answer_pass_when_nothing_ranks_ahead(
        world: World, binder: RunningBinder) -> None:
    await world.node("n-a", 4)
    await world.node("n-b", 4)
    await world.order("held", 1, status=world.held("n-a"))
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("held"))
    requests: list[str] = []
    binder.binder.on_request(lambda: requests.append("answer lane"))
    await settled_full_pass(binder)
    # Heartbeats change no view a placement reads: the kubelet's Ready condition, the agent's report.
    await world.set_ready("n-a", True)
    await world.report("n-a", 4)
    await seen_by(binder, specs.GPU_NODES.key, await world.admin.get(f"{GPUNODES}/{world.node_name('n-a')}"))
    await seen_by(binder, specs.NODES.key, await world.admin.get(f"{NODES}/{world.node_name('n-a')}"))
    asked = len(requests)

    made = await world.order("new", 2)
    await seen_by(binder, specs.GPU_DEVICES.key, made)
    assert len(requests) == asked + 1, "the new order asks for the answer lane at once"

    await binder.answer_pass()

    # The fullest node with room, as the full pass would choose: n-a (3 free) before n-b (4 free).
    assert placement(await world.device("new")) == ("Bound", world.node_name("n-a")), binder.binder.fast_lane.reason
    assert binder.metrics.decisions.labels(lane="answer", action="Bind")._value.get() >= 1


async def test_an_order_waits_for_the_full_pass_while_a_lost_set_waits_for_room_of_its_resource(
        world: World, binder: RunningBinder) -> None:
    await world.node("n-a", 2)
    await world.order("blocker", 2, status=world.held("n-a"))
    await world.order("lost", 2, status={"phase": "Lost"})
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("lost"))
    await settled_full_pass(binder)  # no room: "lost" stays Lost; the finalizers are on
    assert placement(await world.device("lost")) == ("Lost", None)

    # The blocker goes: its finalizer is released by a full pass, and its units with it. A deletion
    # is no ranking event (it only frees units), so the lane stays settled: only the Lost set holds it.
    await world.admin.delete(device_path(world.namespace, "blocker"))
    def blocker_deleting() -> bool:
        blocker = binder.cache.store(specs.GPU_DEVICES).get(world.namespace, "blocker")
        return blocker is not None and bool(blocker["metadata"].get("deletionTimestamp"))

    await cache_until(binder, specs.GPU_DEVICES, blocker_deleting)
    await settled_full_pass(binder)
    with pytest.raises(errors.NotFound):
        await world.device("blocker")
    await cache_until(binder, specs.GPU_DEVICES,
                      lambda: binder.cache.store(specs.GPU_DEVICES).get(world.namespace, "blocker") is None)
    assert binder.binder.fast_lane.settled

    made = await world.order("new", 1)
    await seen_by(binder, specs.GPU_DEVICES.key, made)
    await binder.answer_pass()
    assert placement(await world.device("new")) == ("Pending", None), "the Lost set ranks ahead of it"

    await binder.full_pass()
    # R-BIND-5: the Lost set is rebound first and takes the room; the new order waits, Pending.
    assert placement(await world.device("lost")) == ("Bound", world.node_name("n-a"))
    assert placement(await world.device("new")) == ("Pending", None)


async def test_an_order_waits_for_the_full_pass_after_a_node_changed(world: World, binder: RunningBinder) -> None:
    await world.node("n-a", 2)
    await world.node("n-b", 2)
    await world.order("held", 2, status=world.held("n-a"))
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("held"))
    requests: list[str] = []
    binder.binder.on_request(lambda: requests.append("answer lane"))
    await settled_full_pass(binder)

    # n-a is cordoned: its set must move to n-b, the only other room, before any new order takes it.
    cordoned = await world.admin.merge_patch(f"{NODES}/{world.node_name('n-a')}", {"spec": {"unschedulable": True}})
    await seen_by(binder, specs.NODES.key, cordoned)
    asked = len(requests)
    made = await world.order("new", 2)
    await seen_by(binder, specs.GPU_DEVICES.key, made)

    await binder.answer_pass()
    assert placement(await world.device("new")) == ("Pending", None), "the move off n-a ranks ahead of it"
    assert len(requests) == asked, "no answer lane for a new order the full pass must place"

    await binder.full_pass()
    assert placement(await world.device("held")) == ("Bound", world.node_name("n-b"))
    assert placement(await world.device("new")) == ("Pending", None)
