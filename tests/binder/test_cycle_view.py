"""A placement cycle plans on ``cycle_view`` and decides exactly what it would decide on the whole snapshot.

The worlds are the LiveSnapshot property test's (random cache events:
devices placed, moved, lost, attached, asking; nodes cordoned, gone, not
Ready; reports shrunk below what is held or gone stale; VMIs and launchers;
budgets; classes; stores replaced), taken through the live snapshot as the
binder takes them, in rounds: each round's cycle plans on the view taken
against the round before, its placements are written back into the world
(as the binder's writes would be, or not, at random), and its plan must be
the plan on the whole snapshot, action for action.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.binder.binder import Planned, cycle_view
from cozygpu.model.placement import Bind, MarkLost, PassPlan, plan_pass
from tests.views.test_live_snapshot import World, apply, seed, steps


def _write_back(world: World, plan: PassPlan) -> None:
    """The plan's placements, as the binder's device status writes leave them."""
    store = world.stores[keys.GPUDEVICE_KIND]
    for action in plan.actions:
        if not isinstance(action, Bind | MarkLost):
            continue
        obj = store.get(action.device)
        if obj is None:
            continue
        status = dict(obj.get("status") or {})
        if isinstance(action, Bind):
            status.update(phase="Bound", nodeName=action.node)
        else:
            status["phase"] = "Lost"
            status.pop("nodeName", None)
        world.put(keys.GPUDEVICE_KIND, {**obj, "status": status}, action.device)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(steps, max_size=8), st.booleans()), min_size=1, max_size=5))
def test_a_cycle_on_the_cycle_view_decides_what_it_decides_on_the_whole_snapshot(
        rounds: list[tuple[list[tuple[Any, ...]], bool]]) -> None:
    world = World()
    seed(world)
    last: Planned | None = None
    for events, written in rounds:
        for step in events:
            if step[0] != "check":
                apply(world, step)
        snapshot = world.live.snapshot(now=world.now, sources=world.sources())
        whole = plan_pass(snapshot)
        view = plan_pass(cycle_view(snapshot, last))
        assert view.actions == whole.actions
        last = Planned.of(snapshot, view)
        if written:
            _write_back(world, view)


def test_a_set_that_kept_its_node_and_whose_node_did_not_change_is_left_out() -> None:
    world = World()
    seed(world)
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", None, False, False, False))
    first = world.live.snapshot(now=world.now, sources=world.sources())
    plan = plan_pass(first)
    assert not plan.actions
    second = world.live.snapshot(now=world.now, sources=world.sources())
    view = cycle_view(second, Planned.of(first, plan))
    assert ("tenant-a", "d0") not in view.devices
    # The node goes not Ready: the set is judged again (and moves).
    apply(world, ("node", "n1", False, False, False, 0))
    third = world.live.snapshot(now=world.now, sources=world.sources())
    view = cycle_view(third, Planned.of(second, plan_pass(second)))
    assert ("tenant-a", "d0") in view.devices
    assert plan_pass(view).actions == plan_pass(third).actions


def test_on_a_node_over_its_capacity_the_view_weighs_every_set_held_there() -> None:
    # n1 serves 2 of A and holds 3: the capacity-lost rule sends the larger set (d0) off first, so the
    # set asking (d1) keeps its node. A view of d1's set alone would make d1 the one to leave.
    world = World()
    seed(world)
    for step in (("report", "n1", 2, 2, 0),
                 ("device", "d0", "tenant-a", "a", 2, "Bound", "n1", None, False, False, False),
                 ("device", "d1", "tenant-a", "a", 1, "Bound", "n1", None, False, False, False)):
        apply(world, step)
    first = world.live.snapshot(now=world.now, sources=world.sources())
    last = Planned(first, frozenset())  # as if its plan had acted on nothing
    apply(world, ("device", "d1", "tenant-a", "a", 1, "Bound", "n1", None, False, False, True))
    second = world.live.snapshot(now=world.now, sources=world.sources())
    view = cycle_view(second, last)
    assert ("tenant-a", "d0") in view.devices
    assert plan_pass(view).actions == plan_pass(second).actions
