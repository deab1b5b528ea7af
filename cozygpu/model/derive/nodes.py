"""The node ledger: per node, the units held, in raw use and kept apart for launchers, its report (with
the clock that turns a report stale) and its DRA units; from them its capacity (R-MOD-7), the names it
serves and its room for new bookings.

Contract: contributions touch their node (``touched``); ``refresh`` derives one node again, with
everything that follows from it (the nodes serving each name, the room buckets, the classes'
availability there). A from-scratch build refreshes every node it touched, an update the few it touched:
one step. ``settle`` hands out what moved as values that never change.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping, MutableMapping, Sequence
from datetime import datetime, timedelta

import attrs

from cozygpu.model import capacity as cap
from cozygpu.model.derive.availability import ClassIndex, serves
from cozygpu.model.derive.shared import Stamp, Tally, cow, tally_into
from cozygpu.model.snapshot import DraGroup, NodeCapacity, NodeInventory, touch


def _room(entry: NodeCapacity | None) -> int:
    """The room bucket an entry sits in: its room for new bookings on a fresh report, else 0 (in none)."""
    return entry.room if entry is not None and entry.fresh and entry.room > 0 else 0


def _lost(entries: Mapping[str, NodeCapacity]) -> bool:
    """A fresh report serving less of some name than is held and used (R-BIND-5's capacity lost)."""
    return any(entry.fresh and entry.free < 0 for entry in entries.values())


class NodeLedger:
    """Per node: what is held and used there, what it reports, and the capacity that follows."""

    def __init__(self, classes: ClassIndex, *, stamp: Stamp, stale_after: timedelta,
                 dra_names: frozenset[str] = frozenset()) -> None:
        self._classes = classes
        self._stamp = stamp
        self._stale_after = stale_after
        #: The names DRA offers sell: a node's DRA truth for them is its slices, never a stale report.
        self._dra_names = dra_names
        self.inventories: MutableMapping[str, NodeInventory] = {}
        #: (when a fresh report turns stale, its node), a heap: a report going stale touches its one node.
        #: Entries a newer report superseded stay until they come up, and are skipped then.
        self._deadlines: list[tuple[datetime, str]] = []
        self._held: dict[str, Tally] = {}
        self._raw: dict[str, Tally] = {}
        self._window: dict[str, Tally] = {}
        self._dra: dict[str, Mapping[str, int]] = {}
        #: Node -> resource name -> its groups, for offers with a ``matchAttribute`` (what compaction plans on).
        self.dra_groups: MutableMapping[str, Mapping[str, tuple[DraGroup, ...]]] = {}
        self.capacity: MutableMapping[str, Mapping[str, NodeCapacity]] = {}
        self.over: frozenset[str] = frozenset()
        self.serving: MutableMapping[str, tuple[str, ...]] = {}
        self.rooms: MutableMapping[str, Mapping[int, tuple[str, ...]]] = {}
        #: Name -> the nodes serving it, sorted, as they are now (``serving`` is the last settled copy).
        self._serving: dict[str, list[str]] = {}
        #: Name -> room -> its nodes, sorted, as they are now (``rooms`` is the last settled copy).
        self._rooms: dict[str, dict[int, list[str]]] = {}
        #: (name, room) buckets changed since ``settle``; room 0 stands for the nodes serving the name.
        self._changed: set[tuple[str, int]] = set()
        #: Nodes to refresh: something they hold, use, report or serve changed.
        self.touched: set[str] = set()

    # -- contributions --------------------------------------------------------------------------

    def report(self, name: str, inventory: NodeInventory, now: datetime) -> None:
        """Node ``name``'s report, fresh or stale as of ``now``; its deadline goes on the clock."""
        fresh = cap.report_fresh(inventory.last_report, now=now, stale_after=self._stale_after)
        if inventory.fresh != fresh:
            inventory = attrs.evolve(inventory, fresh=fresh)
        self.inventories[name] = inventory
        self.touched.add(name)
        if inventory.fresh and inventory.last_report is not None:
            heapq.heappush(self._deadlines, (inventory.last_report + self._stale_after, name))
            if len(self._deadlines) > 4 * len(self.inventories) + 64:  # superseded entries: drop them
                self._deadlines = [(i.last_report + self._stale_after, n) for n, i in self.inventories.items()
                                   if i.fresh and i.last_report is not None]
                heapq.heapify(self._deadlines)

    def unreport(self, name: str) -> None:
        """Node ``name``'s report gone (its GPUNode deleted, or unreadable)."""
        if name in self.inventories:
            del self.inventories[name]
            self.touched.add(name)

    def expire(self, now: datetime) -> None:
        """The reports whose time ran out by ``now`` turn stale, each touching its one node (R-MOD-7)."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < now:
            deadline, name = heapq.heappop(deadlines)
            inventory = self.inventories.get(name)
            if (inventory is None or not inventory.fresh or inventory.last_report is None
                    or inventory.last_report + self._stale_after != deadline):
                continue  # superseded by a newer report, or gone
            self.inventories[name] = attrs.evolve(inventory, fresh=False)
            self.touched.add(name)

    def dra(self, name: str, served: Mapping[str, int]) -> None:
        """What DRA-sourced offers serve on node ``name`` now (empty: nothing)."""
        if served:
            self._dra[name] = dict(served)
        else:
            self._dra.pop(name, None)
        self.touched.add(name)

    def groups(self, name: str, groups: Mapping[str, tuple[DraGroup, ...]]) -> None:
        """Node ``name``'s DRA groups now (empty: none)."""
        if groups:
            self.dra_groups[name] = dict(groups)
        elif name in self.dra_groups:
            del self.dra_groups[name]

    def hold(self, node: str, resource: str, count: int, sign: int) -> None:
        """A Bound device's ``count`` units of ``resource`` held on ``node``, added (+1) or taken away (-1)."""
        tally_into(self._held, node, {resource: count}, sign)
        self.touched.add(node)

    def use(self, node: str, beyond: Mapping[str, int], window: Mapping[str, int], sign: int) -> None:
        """A pod's raw units in use on ``node`` and those a launcher window keeps apart there."""
        for tallies, amounts in ((self._raw, beyond), (self._window, window)):
            if amounts:
                tally_into(tallies, node, amounts, sign)
                self.touched.add(node)

    # -- derivation ----------------------------------------------------------------------------

    def serving_of(self, name: str) -> Sequence[str]:
        """The nodes serving ``name`` now, sorted."""
        return self._serving.get(name, ())

    def refresh(self, node: str) -> None:
        """A node's capacity may have changed: its entries, the names it serves, its rooms, and the
        availability there."""
        before = self.capacity.get(node)
        held, raw, window = self._held.get(node), self._raw.get(node), self._window.get(node)
        present = node in self.inventories or held or raw or window or node in self._dra
        after = cap.node_capacity(node, inventory=self.inventories.get(node), held=held.sums if held else {},
                                  raw_in_use=raw.sums if raw else {}, window=window.sums if window else {},
                                  dra=self._dra.get(node), dra_names=self._dra_names) if present else None
        if after == before:
            return  # the same entries: nothing that follows from them moves either
        if after is not None:
            self.capacity[node] = after
        else:
            self.capacity.pop(node, None)
        before, after = before or {}, after or {}
        if _lost(after) != (node in self.over):
            self.over = self.over ^ {node}
        for name in sorted(set(before) | set(after)):
            was, entry = before.get(name), after.get(name)
            if was == entry:
                continue
            found = self._serving.get(name)
            if entry is not None and entry.fresh and entry.served > 0:
                if found is None:
                    found = self._serving[name] = []
                if not serves(found, node):
                    bisect.insort(found, node)
                    self._changed.add((name, 0))
            elif found is not None and serves(found, node):
                found.remove(node)
                if not found:
                    del self._serving[name]
                self._changed.add((name, 0))
            self._move_room(node, name, _room(was), _room(entry))
            self._classes.moved(node, name, was.served if was is not None else 0, entry, self.serving_of(name))

    def _move_room(self, node: str, name: str, before: int, after: int) -> None:
        """Move ``node`` from the ``before`` room bucket of ``name`` to the ``after`` one (0: in none)."""
        if before == after:
            return
        touch(self._stamp.log.names, name, self._stamp.generation)
        buckets = self._rooms.setdefault(name, {})
        if before > 0:
            buckets[before].remove(node)
            if not buckets[before]:
                del buckets[before]
            self._changed.add((name, before))
        if after > 0:
            bisect.insort(buckets.setdefault(after, []), node)
            self._changed.add((name, after))
        if not buckets:
            del self._rooms[name]

    def settle(self) -> None:
        """The serving tuples and room buckets that changed, made again for the Snapshot to hold; the maps
        a Snapshot holds, as ``CowMap``s from now on."""
        self.inventories, self.dra_groups = cow(self.inventories), cow(self.dra_groups)
        self.capacity, self.serving, self.rooms = cow(self.capacity), cow(self.serving), cow(self.rooms)
        rooms: dict[str, dict[int, tuple[str, ...]]] = {}
        for name, room in self._changed:
            if room == 0:
                found = self._serving.get(name)
                if found:
                    self.serving[name] = tuple(found)
                else:
                    self.serving.pop(name, None)
                continue
            buckets = rooms.get(name)
            if buckets is None:
                buckets = rooms[name] = dict(self.rooms.get(name, {}))
            nodes = self._rooms.get(name, {}).get(room)
            if nodes:
                buckets[room] = tuple(nodes)
            else:
                buckets.pop(room, None)
        for name, buckets in rooms.items():
            if buckets:
                self.rooms[name] = buckets
            else:
                self.rooms.pop(name, None)
        self._changed.clear()
