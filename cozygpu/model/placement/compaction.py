"""Compaction (R-BIND-11): room for an order no node has, made by moving stopped holds.

Why: single-GPU holds of switched-off VMs scatter over the fleet, and an
order of four or eight GPUs on one node is then refused although the class
has that many free. A stopped hold cares about its class, not its node
(R-BIND-5 already moves one off a cordon), so the binder may move a few of
them and place the order where they were.

The plan (``plan_compaction``) is a pure function of what it is given:

- **What may move**: the holds ``movable`` names on a node — Bound devices of
  the order's class attached to no VMI (so no VM, running or not, uses them;
  R-BIND-7), of a class that allows it and a namespace that did not opt out.
  Each is a set of one and moves whole.
- **Where to**: a ``destinations`` node other than the one being emptied,
  with free units for it after every earlier move of the plan (the class's
  eligibility, as for any placement).
- **Which plan**: the fewest moves; then the fewest units moved; then the
  order's node left fullest (bin-packing, R-BIND-5); then the node's name.
  Each move goes to the fullest destination that takes it (best fit, largest
  hold first), and the search over destinations is exact: it backtracks over
  distinct free counts, not nodes, so it costs the plan's few holds, not the
  fleet. Nodes are visited most free first and the visit stops once a bound
  (the largest movable hold) says no node left can win: the fleet's nodes are
  sorted, not walked.

``tests/model/test_compaction_properties.py`` holds the number of moves to a
brute-force minimum over small fleets.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import attrs

from cozygpu.model.snapshot import DeviceKey


@attrs.frozen(kw_only=True)
class Relocation:
    """One stopped hold moved to make room: ``count`` units of ``device`` from ``source`` to ``target``."""

    device: DeviceKey
    source: str
    target: str
    count: int


@attrs.frozen(kw_only=True)
class Compaction:
    """Where the order goes (``node``) once ``moves`` have emptied enough of it."""

    node: str
    moves: tuple[Relocation, ...]

    @property
    def units_moved(self) -> int:
        return sum(move.count for move in self.moves)

    def said(self) -> str:
        """What an answer says of it: ``placed on gpu-3 after moving 2 stopped holds``."""
        n = len(self.moves)
        return f"placed on {self.node} after moving {n} stopped hold{'s' if n != 1 else ''}"


Hold = tuple[DeviceKey, int]


def plan_compaction(*, need: int, free: Mapping[str, int], candidates: Iterable[str],
                    movable: Callable[[str], Sequence[Hold]], destinations: Collection[str],
                    largest: int, room: Mapping[str, int] | None = None,
                    node_of: Callable[[str], str] | None = None) -> Compaction | None:
    """The best plan that leaves one of ``candidates`` with ``need`` free units, or None when none exists.

    ``free``: free units per node now (a node not in it has none); ``movable(candidate)``: the holds there
    that may move, with their units; ``destinations``: the nodes a moved hold may go to; ``largest``: no
    movable hold has more units (0: none may move). A candidate is a node, or with ``node_of`` a part of one
    (a DRA offer's group of devices sharing a ``matchAttribute`` value): ``room`` then says its free units
    (``free`` still the nodes', which a moved hold needs), and a hold never moves within its candidate's node.

    Nodes are visited most free first: a node short of ``s`` units needs at least ``ceil(s / largest)``
    moves and ``s`` units moved, so once that bound cannot beat (or tie) the best plan found, no node left
    can, and the rest are never walked: with single-GPU holds the first node decides.
    """
    if largest <= 0:
        return None
    at = free if room is None else room
    order = sorted(candidates, key=lambda site: (-max(at.get(site, 0), 0), site))
    rooms: _Rooms | None = None
    best: tuple[int, int, int, str] | None = None
    plan: Compaction | None = None
    for site in order:
        here = max(at.get(site, 0), 0)
        short = need - here
        if short <= 0:
            continue
        bound = (short + largest - 1) // largest
        if best is not None and ((bound, short) > best[:2] or ((bound, short) == best[:2] and best[2] == 0)):
            break  # every node left is worse, or ties and loses on its name (R-BIND-5's order)
        holds = sorted(movable(site), key=lambda hold: (-hold[1], hold[0]))
        fewest, taken = 0, 0
        for _, count in holds:
            if taken >= short:
                break
            fewest, taken = fewest + 1, taken + count
        if taken < short or (best is not None and fewest > best[0]):
            continue
        rooms = rooms if rooms is not None else _Rooms(free, destinations)
        node = node_of(site) if node_of is not None else site
        found = _best_on(node, short, fewest, holds, rooms, best[0] if best is not None else len(holds))
        if found is None:
            continue
        moved = sum(move.count for move in found)
        score = (len(found), moved, here + moved - need, site)
        if best is None or score < best:
            best, plan = score, Compaction(node=node, moves=found)
    return plan


def _best_on(node: str, short: int, fewest: int, holds: Sequence[Hold], rooms: _Rooms,
             most: int) -> tuple[Relocation, ...] | None:
    """The moves off ``node`` freeing ``short`` units in the fewest holds (then the fewest units) whose
    holds all find a destination; None within ``most`` moves."""
    for k in range(fewest, min(most, len(holds)) + 1):
        subsets = [chosen for chosen in itertools.combinations(holds, k) if sum(c for _, c in chosen) >= short]
        subsets.sort(key=lambda chosen: (sum(c for _, c in chosen), [key for key, _ in chosen]))
        for chosen in subsets:
            targets = rooms.pack([count for _, count in chosen], avoid=node)
            if targets is not None:
                return tuple(Relocation(device=key, source=node, target=target, count=count)
                             for (key, count), target in zip(chosen, targets, strict=True))
    return None


class _Rooms:
    """The destinations' free units, grouped by how many are free: packing backtracks over the counts."""

    def __init__(self, free: Mapping[str, int], destinations: Collection[str]) -> None:
        self._by_room: dict[int, list[str]] = {}
        for node in destinations:
            room = free.get(node, 0)
            if room > 0:
                self._by_room.setdefault(room, []).append(node)
        for nodes in self._by_room.values():
            nodes.sort()

    def pack(self, sizes: Sequence[int], *, avoid: str) -> list[str] | None:
        """A destination for each of ``sizes`` (largest first, as given), none of them ``avoid``; each the
        fullest that takes it; None when they cannot all be placed. The rooms are as before on return."""
        stack: list[tuple[int, int, str]] = []  # (room before, size, node) of each placement, in order

        def place(i: int) -> bool:
            if i == len(sizes):
                return True
            size = sizes[i]
            for room in sorted(r for r in self._by_room if r >= size):
                node = next((n for n in self._by_room.get(room, ()) if n != avoid), None)
                if node is None:
                    continue
                self._move(node, room, room - size)
                stack.append((room, size, node))
                if place(i + 1):
                    return True
                stack.pop()
                self._move(node, room - size, room)
            return False

        found = place(0)
        result = [node for _, _, node in stack]
        for room, size, node in reversed(stack):
            self._move(node, room - size, room)
        return result if found else None

    def _move(self, node: str, before: int, after: int) -> None:
        """The node's free units go from ``before`` to ``after`` (nodes without room are not kept)."""
        if before > 0:
            nodes = self._by_room[before]
            nodes.remove(node)
            if not nodes:
                del self._by_room[before]
        if after > 0:
            bisect.insort(self._by_room.setdefault(after, []), node)
