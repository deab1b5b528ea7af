"""An answer pass plans on ``answer_view`` and decides exactly what it would decide on the whole snapshot.

The worlds are the LiveSnapshot property test's: random sequences of cache
events (devices placed, moved, lost, attached, asking; nodes cordoned;
reports shrunk below what is held; launchers; budgets).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.binder.binder import answer_view
from cozygpu.model.placement import plan_pass
from cozygpu.model.snapshot import Phase
from tests.views.test_live_snapshot import World, apply, seed, steps


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, max_size=30), st.booleans())
def test_an_answer_pass_on_the_answer_view_decides_what_it_decides_on_the_whole_snapshot(
        events: list[tuple[Any, ...]], new_orders: bool) -> None:
    world = World()
    seed(world)
    for step in events:
        if step[0] != "check":
            apply(world, step)
    snapshot = world.reference()
    wanted = [k for k, d in snapshot.devices.items() if d.unanswered_request or d.phase is Phase.PENDING]
    whole = plan_pass(snapshot, answers_only=True, new_orders=new_orders)
    view = plan_pass(answer_view(snapshot, wanted), answers_only=True, new_orders=new_orders)
    assert view.actions == whole.actions


def test_on_a_node_over_its_capacity_the_answer_view_weighs_every_set_held_there() -> None:
    # n1 serves 2 of A and holds 3: the capacity-lost rule sends the larger set (d0) off first, so the
    # set asking (d1) keeps its node. A view of d1's set alone would make d1 the one to leave.
    world = World()
    seed(world)
    for step in (("report", "n1", 2, 2, 0),
                 ("device", "d0", "tenant-a", "a", 2, "Bound", "n1", None, False, False, False),
                 ("device", "d1", "tenant-a", "a", 1, "Bound", "n1", None, False, False, True)):
        apply(world, step)
    snapshot = world.reference()
    whole = plan_pass(snapshot, answers_only=True)
    view = plan_pass(answer_view(snapshot, [("tenant-a", "d1")]), answers_only=True)
    assert view.actions == whole.actions
