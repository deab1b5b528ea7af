"""A placement cycle plans on ``cycle_view`` and decides exactly what it would decide on the whole snapshot.

The worlds are the LiveSnapshot property test's (random cache events:
devices placed, moved, lost, attached, asking; nodes cordoned, gone, not
Ready; reports shrunk below what is held or gone stale; VMIs and launchers;
budgets; classes; stores replaced), taken through the live snapshot as the
binder takes them, in rounds: each round's cycle plans on the view taken
against the round before, its placements are written back into the world
(as the binder's writes would be, or not, at random), and its plan must be
the plan on the whole snapshot, action for action — but for orders left out
that the whole plan keeps Pending for the very reason the last cycle gave.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.binder.cycle import Planned, cycle_view, plan_cycle
from cozygpu.model.placement import Bind, KeepPending, MarkLost, PassPlan, plan_pass
from tests.views.test_live_snapshot import RESOURCES, World, apply, seed, steps


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
        view, plan = plan_cycle(snapshot, last)
        left_out = [a for a in whole.actions if isinstance(a, KeepPending) and a.device not in view.devices]
        assert plan.actions == tuple(a for a in whole.actions if a not in left_out)
        for repeated in left_out:
            assert last is not None
            assert last.kept.get(repeated.device) == repeated
        last = Planned.of(snapshot, view, plan, last)
        if written:
            _write_back(world, plan)


def test_a_set_that_kept_its_node_and_whose_node_did_not_change_is_left_out() -> None:
    world = World()
    seed(world)
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", None, False, False, False))
    first = world.live.snapshot(now=world.now, sources=world.sources())
    plan = plan_pass(first)
    assert not plan.actions
    second = world.live.snapshot(now=world.now, sources=world.sources())
    view = cycle_view(second, Planned.of(first, first, plan))
    assert ("tenant-a", "d0") not in view.devices
    # The node goes not Ready: the set is judged again (and moves).
    apply(world, ("node", "n1", False, False, False, 0))
    third = world.live.snapshot(now=world.now, sources=world.sources())
    view = cycle_view(third, Planned.of(second, second, plan_pass(second)))
    assert ("tenant-a", "d0") in view.devices
    assert plan_pass(view).actions == plan_pass(third).actions


def test_on_a_node_over_its_capacity_the_view_weighs_every_set_held_there() -> None:
    # n1 serves 2 of A and holds 3: the capacity-lost rule sends the larger set (d0) off first, so the
    # set asking (d1) keeps its node. A view of d1's set alone would make d1 the one to leave.
    world = World()
    seed(world)
    for step in (("report", "n1", 2, 2, 0, "both"),
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


def test_an_order_kept_pending_is_judged_again_when_room_for_its_name_comes_not_on_every_change() -> None:
    world = World()
    seed(world)
    # Three units of A asked for where every node serves four of A and holds three: no room.
    for i, node_name in enumerate(("n1", "n2", "n3")):
        apply(world, ("device", f"held{i}", "tenant-b", "a", 3, "Bound", node_name, None, False, False, False))
    apply(world, ("device", "waits", "tenant-b", "a", 3, "Pending", None, None, False, False, False))
    first = world.live.snapshot(now=world.now, sources=world.sources())
    view, plan = plan_cycle(first, None)
    (kept,) = plan.of(KeepPending)
    assert kept.device == ("tenant-b", "waits")
    last = Planned.of(first, view, plan, None)
    second = world.live.snapshot(now=world.now, sources=world.sources())
    view, plan = plan_cycle(second, last)
    last = Planned.of(second, view, plan, last)  # judged once more (it was acted on); the reason repeats
    assert ("tenant-b", "waits") not in last.acted

    # Room for B only (another name) and a label: the order would be kept for the same reason, so it is out.
    apply(world, ("report", "n1", 4, 3, 0, "both"))
    apply(world, ("node", "n2", True, False, True, 1))
    third = world.live.snapshot(now=world.now, sources=world.sources())
    view, plan = plan_cycle(third, last)
    assert ("tenant-b", "waits") not in view.devices
    assert plan_pass(third).of(KeepPending) == (last.kept[("tenant-b", "waits")],)
    last = Planned.of(third, view, plan, last)

    # A held set of A goes: room for A came back, and the order is judged again (and bound).
    apply(world, ("delete device", "held1", "tenant-b"))
    fourth = world.live.snapshot(now=world.now, sources=world.sources())
    changes = fourth.changes_since(third)
    assert changes is not None
    assert RESOURCES[0] in changes.names
    view, plan = plan_cycle(fourth, last)
    assert ("tenant-b", "waits") in view.devices
    assert [(b.device, b.node) for b in plan.of(Bind)] == [(("tenant-b", "waits"), "n2")]


def test_an_order_kept_pending_over_a_budget_is_judged_again_when_its_tenants_usage_falls() -> None:
    world = World()
    seed(world)  # tenant-a may hold 6
    apply(world, ("device", "lost", "tenant-a", "a", 3, "Lost", None, None, False, False, False))
    apply(world, ("device", "held", "tenant-a", "a", 2, "Bound", "n1", None, False, False, False))
    apply(world, ("device", "waits", "tenant-a", "a", 2, "Pending", None, None, False, False, False))
    last: Planned | None = None
    for _ in range(2):  # the first cycle keeps it Pending over the budget, the second repeats that
        snapshot = world.live.snapshot(now=world.now, sources=world.sources())
        view, plan = plan_cycle(snapshot, last)
        last = Planned.of(snapshot, view, plan, last)
    assert last is not None
    assert ("tenant-a", "waits") in last.kept
    assert ("tenant-a", "waits") not in last.acted

    # The Lost set goes: no node's room moves, but the tenant's usage falls under its budget.
    apply(world, ("delete device", "lost", "tenant-a"))
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    changes = snapshot.changes_since(last.snapshot)
    assert changes is not None
    assert not changes.names
    view, plan = plan_cycle(snapshot, last)
    assert [b.device for b in plan.of(Bind)] == [("tenant-a", "waits")]
