"""A full pass plans on ``full_view`` and decides exactly what it would decide on the whole snapshot.

The worlds are the LiveSnapshot property test's (random cache events:
devices placed, moved, lost, attached, asking; nodes cordoned, gone, not
Ready; reports shrunk below what is held or gone stale; VMIs and launchers;
budgets; classes; stores replaced), taken through the live snapshot as the
binder takes them, in rounds: each round's full pass plans on the view taken
against the round before, its placements are written back into the world
(as the binder's writes would be, or not, at random), and its plan must be
the plan on the whole snapshot, action for action.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.binder.binder import Planned, full_view
from cozygpu.model.placement import Bind, MarkLost, PassPlan, plan_pass
from cozygpu.model.snapshot import Phase, Snapshot
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


def _wanted(snapshot: Snapshot) -> list[tuple[str, str]]:
    return [k for k, d in snapshot.devices.items() if d.unanswered_request or d.phase is Phase.PENDING]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(steps, max_size=8), st.booleans()), min_size=1, max_size=5))
def test_a_full_pass_on_the_full_view_decides_what_it_decides_on_the_whole_snapshot(
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
        view = plan_pass(full_view(snapshot, last, _wanted(snapshot)))
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
    view = full_view(second, Planned.of(first, plan), _wanted(second))
    assert ("tenant-a", "d0") not in view.devices
    # The node goes not Ready: the set is judged again (and moves).
    apply(world, ("node", "n1", False, False, False, 0))
    third = world.live.snapshot(now=world.now, sources=world.sources())
    view = full_view(third, Planned.of(second, plan_pass(second)), _wanted(third))
    assert ("tenant-a", "d0") in view.devices
    assert plan_pass(view).actions == plan_pass(third).actions
