"""The units one planning run books on top of the snapshot's room (R-BIND-5, R-MOD-7).

Why: a run places many sets, and each must see the units the earlier ones
took or freed, so two sets cannot race past a node's free units. It never
copies a table of the fleet: a booking is kept per (node, resource name)
beside the snapshot's room, and a node booked on is weighed apart from the
snapshot's room buckets when the fullest node with room is looked for.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from cozygpu.model.snapshot import NodeCapacity, Snapshot

_NO_CAPACITY: Mapping[str, NodeCapacity] = {}
_NO_ROOMS: Mapping[int, tuple[str, ...]] = {}


class Units:
    """Free units per node and resource name, the snapshot's less what this run booked. Local to one run."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.s = snapshot
        # (node, resource name) -> units this pass booked there (negative: freed), on top of the snapshot's
        # room; per name, the nodes booked on (``fullest`` weighs them apart from the snapshot's room buckets).
        self._booked: dict[tuple[str, str], int] = {}
        self._booked_nodes: dict[str, set[str]] = {}

    def _entry(self, node: str, name: str) -> NodeCapacity | None:
        """The node's capacity for the name on a fresh report; None on a stale or missing one."""
        entry = self.s.capacity.get(node, _NO_CAPACITY).get(name)
        return entry if entry is not None and entry.fresh else None

    def free(self, node: str, name: str) -> int:
        """Units a booking may take now; zero on a stale or missing report, negative when full or lost."""
        entry = self._entry(node, name)
        return entry.room + self._booked.get((node, name), 0) if entry is not None else 0

    def kept(self, node: str, name: str) -> int:
        """Free units now with a launcher window's given back: below zero only when capacity was lost (R-MOD-7)."""
        entry = self._entry(node, name)
        return self.free(node, name) + (entry.window if entry is not None else 0)

    def max_free(self, name: str) -> int:
        """The most free units of ``name`` on one node now (at least 0): from the room buckets, not the nodes."""
        booked = self._booked_nodes.get(name, ())
        best = max([0, *(self.free(node, name) for node in booked)])
        buckets = self.s.rooms.get(name, _NO_ROOMS)
        for room in sorted(buckets, reverse=True):
            if room <= best:
                break
            if any(node not in booked for node in buckets[room]):
                return room
        return best

    def fullest(self, name: str, units: int, candidates: Collection[str], skip: Collection[str]) -> str | None:
        """The fullest candidate node with room for ``units`` of ``name`` (R-BIND-5; ties by node name).

        The snapshot's room buckets are walked from ``units`` up, in name order within a bucket, so the
        first candidate met is the best of the nodes this pass has not booked on; those are weighed apart.
        """
        booked = self._booked_nodes.get(name, ())
        best: tuple[int, str] | None = None
        buckets = self.s.rooms.get(name, _NO_ROOMS)
        for room in sorted(r for r in buckets if r >= units):
            found = next((node for node in buckets[room]
                          if node in candidates and node not in booked and node not in skip), None)
            if found is not None:
                best = (room - units, found)
                break
        for node in booked:
            left = self.free(node, name) - units
            if left >= 0 and node in candidates and node not in skip and (best is None or (left, node) < best):
                best = (left, node)
        return best[1] if best is not None else None

    def book(self, node: str, name: str, units: int) -> None:
        """Take ``units`` of ``name`` on ``node`` (negative: free them); a node without a fresh report books none."""
        if self._entry(node, name) is not None:
            key = (node, name)
            self._booked[key] = self._booked.get(key, 0) - units
            self._booked_nodes.setdefault(name, set()).add(node)
