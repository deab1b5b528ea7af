"""Compaction's plan against a brute force over small fleets (R-BIND-11).

The plan moves stopped holds off one node to others so that an order fits
there; a move never makes room for another. The brute force tries every node,
every subset of its movable holds and every assignment of them to other nodes
with room, and keeps the fewest moves (then the fewest units moved).
"""

from __future__ import annotations

import itertools

import attrs
import hypothesis
import pytest
from hypothesis import strategies as hst

from cozygpu.model.placement.compaction import Compaction, Hold, plan_compaction


@attrs.frozen
class Fleet:
    capacity: dict[str, int]
    #: Node -> its holds: (name, units, may move).
    holds: dict[str, list[tuple[str, int, bool]]]

    def free(self) -> dict[str, int]:
        return {node: self.capacity[node] - sum(units for _, units, _ in self.holds[node]) for node in self.capacity}

    def movable(self, node: str) -> list[Hold]:
        return [(("t", name), units) for name, units, moves in self.holds[node] if moves]


@hst.composite
def fleets(draw: hst.DrawFn) -> tuple[Fleet, int]:
    count = draw(hst.integers(2, 5))
    capacity: dict[str, int] = {}
    holds: dict[str, list[tuple[str, int, bool]]] = {}
    serial = itertools.count()
    for i in range(count):
        node = f"n{i}"
        capacity[node] = draw(hst.integers(1, 6))
        left = capacity[node]
        holds[node] = []
        while left > 0 and draw(hst.integers(0, 4)) > 0:  # nodes mostly full: fragmentation is the case
            units = draw(hst.integers(1, min(3, left)))
            holds[node].append((f"h{next(serial)}", units, draw(hst.integers(0, 3)) > 0))
            left -= units
    fleet = Fleet(capacity, holds)
    # Compaction is asked only when no node has room: the order is larger than every node's free units.
    return fleet, max(fleet.free().values()) + draw(hst.integers(1, 2))


def brute_force(fleet: Fleet, need: int) -> tuple[int, int] | None:
    """The fewest moves, then units moved, of any plan that empties one node enough; None when none does."""
    free = fleet.free()
    best: tuple[int, int] | None = None
    for node in fleet.capacity:
        movable = fleet.movable(node)
        for k in range(len(movable) + 1):
            for chosen in itertools.combinations(movable, k):
                if free[node] + sum(units for _, units in chosen) < need:
                    continue
                others = [n for n in fleet.capacity if n != node]
                for targets in itertools.product(others, repeat=k):
                    room = dict(free)
                    for (_, units), target in zip(chosen, targets, strict=True):
                        room[target] -= units
                    if all(room[n] >= 0 for n in others):
                        score = (k, sum(units for _, units in chosen))
                        best = score if best is None or score < best else best
                        break
    return best


def plan(fleet: Fleet, need: int, *, loose: bool = False) -> Compaction | None:
    """The plan, with ``largest`` exactly the largest movable hold, or (``loose``) any bound above it."""
    sizes = [units for node in fleet.capacity for _, units in fleet.movable(node)]
    return plan_compaction(need=need, free=fleet.free(), candidates=sorted(fleet.capacity), movable=fleet.movable,
                           destinations=sorted(fleet.capacity), largest=99 if loose else max(sizes, default=0))


@pytest.mark.parametrize("loose", [False, True], ids=["largest-hold", "loose-bound"])
@hypothesis.settings(max_examples=1500)
@hypothesis.given(case=fleets())
def test_the_plan_takes_the_fewest_moves_a_brute_force_finds_and_moves_only_what_may_move(
        case: tuple[Fleet, int], loose: bool) -> None:
    fleet, need = case
    found, expected = plan(fleet, need, loose=loose), brute_force(fleet, need)
    hypothesis.note(f"plan {found}, brute force {expected}")
    if expected is None:
        assert found is None
        return
    assert found is not None, f"no plan, but {expected[0]} move(s) would do"
    assert (len(found.moves), found.units_moved) == expected
    # The plan as written: movable holds of the order's node only, each once and whole; nothing overbooked.
    movable = dict(fleet.movable(found.node))
    room = fleet.free()
    assert len({move.device for move in found.moves}) == len(found.moves), "a hold moves once"
    for move in found.moves:
        assert move.source == found.node
        assert move.target != found.node
        assert movable.get(move.device) == move.count, "only a movable hold of the order's node moves, whole"
        room[move.source] += move.count
        room[move.target] -= move.count
    assert all(units >= 0 for units in room.values()), f"a destination overbooked: {room}"
    assert room[found.node] >= need


def test_an_order_of_four_where_every_four_gpu_node_has_three_stopped_holds_moves_three_of_one_node() -> None:
    fleet = Fleet(capacity={f"n{i}": 4 for i in range(4)},
                  holds={f"n{i}": [(f"h{i}{j}", 1, True) for j in range(3)] for i in range(4)})
    found = plan(fleet, 4)
    assert found is not None
    assert found.said() == "placed on n0 after moving 3 stopped holds"
    assert sorted(m.target for m in found.moves) == ["n1", "n2", "n3"]  # one to each node's free GPU
    fleet.holds["n3"].append(("h33", 1, True))  # n3 full: n0's three holds have two free GPUs to go to
    assert plan(fleet, 4) is None


def test_a_running_vms_hold_never_moves_and_the_plan_goes_where_only_stopped_ones_are() -> None:
    fleet = Fleet(capacity={"a": 4, "b": 4, "c": 4},
                  holds={"a": [("run", 1, False), ("s1", 1, True)], "b": [("s2", 1, True)], "c": []})
    found = plan(fleet, 4)
    assert found is not None
    assert found.node == "b"
    assert [m.device for m in found.moves] == [("t", "s2")]


def test_ties_go_to_the_fewest_units_moved_then_the_fullest_node() -> None:
    # "a" frees 4 with one hold of 4 (4 units moved); "b" frees 4 with one hold of 2 (it has 2 free already).
    fleet = Fleet(capacity={"a": 4, "b": 4, "c": 8}, holds={"a": [("big", 4, True)], "b": [("two", 2, True)],
                                                             "c": [("x", 3, False)]})
    found = plan(fleet, 4)
    assert found is not None
    assert (found.node, found.units_moved) == ("b", 2)
