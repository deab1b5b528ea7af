"""Class availability: the classes, the Node views that decide where each may go, and each class's free
units over the nodes eligible for it (R-MOD-8, R-MOD-12).

Contract: a class's availability is only ever made node by node (``moved``), from an empty one: the
same step whether one node changed or every node is new. ``settle`` hands out the classes that moved as
``ClassAvailability`` values that never change.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence

from cozygpu.model import capacity as cap
from cozygpu.model.derive.shared import Stamp, cow
from cozygpu.model.eligibility import node_problem
from cozygpu.model.snapshot import ClassAvailability, GPUClassView, NodeCapacity, NodeView, touch


def serves(serving: Sequence[str], node: str) -> bool:
    """Whether ``node`` is in the sorted ``serving``."""
    at = bisect.bisect_left(serving, node)
    return at < len(serving) and serving[at] == node


class _Free:
    """One class's availability as it is being made: eligible node -> its free units, and the sums."""

    __slots__ = ("best", "best_node", "node_free", "served", "total")

    def __init__(self) -> None:
        self.node_free: MutableMapping[str, int] = {}
        self.total = 0
        self.served = 0
        self.best = 0
        self.best_node: str | None = None


class ClassIndex:
    """The classes by name and by resource name, the Node views, and each class's availability."""

    def __init__(self, classes: Iterable[GPUClassView] = (), nodes: Iterable[NodeView] = (),
                 *, stamp: Stamp) -> None:
        self.classes: dict[str, GPUClassView] = {c.name: c for c in classes}
        self.resource_of = {name: c.resource_name for name, c in self.classes.items()}
        self.classes_of: defaultdict[str, list[GPUClassView]] = defaultdict(list)
        for gpu_class in self.classes.values():
            self.classes_of[gpu_class.resource_name].append(gpu_class)
        self.nodes: MutableMapping[str, NodeView] = {n.name: n for n in nodes}
        self.availability: MutableMapping[str, ClassAvailability] = {}
        self._free = {name: _Free() for name in self.classes}
        #: Classes whose availability moved since the last ``settle``.
        self._moved: set[str] = set(self.classes)
        self._stamp = stamp

    def node_view(self, name: str, view: NodeView | None) -> None:
        if view is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = view

    def moved(self, node: str, name: str, served_before: int, entry: NodeCapacity | None,
              serving: Sequence[str]) -> None:
        """``node``'s entry of resource ``name`` is now ``entry`` (it served ``served_before`` of it before;
        ``serving``: the sorted nodes serving the name now): the availability of each class of the name."""
        for gpu_class in self.classes_of.get(name, ()):
            if self._available(gpu_class, node, served_before, entry, serving):
                self._moved.add(gpu_class.name)
                touch(self._stamp.log.names, name, self._stamp.generation)

    def eligibility(self, node: str, entries: Mapping[str, NodeCapacity],
                    serving: Callable[[str], Sequence[str]]) -> None:
        """``node``'s view changed (labels, taints, Ready, cordon): the availability of the classes of the
        names it has entries of (``entries``: its capacity)."""
        for name, entry in sorted(entries.items()):
            self.moved(node, name, entry.served, entry, serving(name))

    def put(self, name: str, gpu_class: GPUClassView | None) -> None:
        """Class ``name`` replaced by ``gpu_class`` (None: gone), in copies (a snapshot handed out keeps its
        own); its availability starts empty and is made by ``remake`` once the nodes are refreshed."""
        self.classes = dict(self.classes)
        before = self.classes.pop(name, None)
        if before is not None:
            self.classes_of[before.resource_name] = [c for c in self.classes_of[before.resource_name]
                                                     if c.name != name]
            if not self.classes_of[before.resource_name]:
                del self.classes_of[before.resource_name]
            del self.resource_of[name]
            touch(self._stamp.log.names, before.resource_name, self._stamp.generation)
        self._free.pop(name, None)
        if gpu_class is None:
            self.availability.pop(name, None)
            self._moved.discard(name)
            return
        self.classes[name] = gpu_class
        self.resource_of[name] = gpu_class.resource_name
        self.classes_of[gpu_class.resource_name].append(gpu_class)
        self._free[name] = _Free()
        self._moved.add(name)

    def remake(self, names: Iterable[str], capacity: Mapping[str, Mapping[str, NodeCapacity]],
               serving: Callable[[str], Sequence[str]]) -> None:
        """The availability of the classes ``names`` made again, from empty, node by node over the nodes
        serving each one's resource name; those nodes and the name are logged."""
        stamp = self._stamp
        for class_name in names:
            gpu_class = self.classes.get(class_name)
            if gpu_class is None:
                continue
            name = gpu_class.resource_name
            self._free[class_name] = _Free()
            self._moved.add(class_name)
            nodes = serving(name)
            for node in nodes:
                self._available(gpu_class, node, 0, capacity.get(node, {}).get(name), nodes)
            touch(stamp.log.names, name, stamp.generation)
            for node in nodes:
                touch(stamp.log.nodes, node, stamp.generation)

    def _available(self, gpu_class: GPUClassView, node: str, served_before: int, entry: NodeCapacity | None,
                   serving: Sequence[str]) -> bool:
        """The class's availability after ``node`` changed; whether it moved."""
        free = self._free[gpu_class.name]
        old = free.node_free.get(node)
        new = None
        if serves(serving, node) and not node_problem(
            self.nodes.get(node), node_name=node, tolerations=gpu_class.tolerations,
            selector=gpu_class.node_selector,
        ):
            new = cap.free_for_binds(entry)
        if new == old and (new is None or served_before == (entry.served if entry is not None else 0)):
            return False  # the node counts for the class as it did: nothing here moved
        if new is None:
            free.node_free.pop(node, None)
        else:
            free.node_free[node] = new
        free.total += (new or 0) - (old or 0)
        free.served += ((entry.served if new is not None and entry is not None else 0)
                        - (served_before if old is not None else 0))
        if free.best_node == node and (new is None or new < free.best):
            free.best, free.best_node = 0, None  # the best went down: look again, in name order
            for name in serving:
                units = free.node_free.get(name)
                if units is not None and units > free.best:
                    free.best, free.best_node = units, name
        elif new is not None and (new > free.best or (new == free.best and new > 0 and free.best_node is not None
                                                      and node < free.best_node)):
            free.best, free.best_node = new, node
        return True

    def settle(self) -> None:
        """Each class whose availability moved gets a new ``ClassAvailability`` (the earlier stays as it was);
        the maps a Snapshot holds, as ``CowMap``s from now on."""
        self.nodes, self.availability = cow(self.nodes), cow(self.availability)
        for class_name in self._moved:
            free = self._free[class_name]
            node_free = free.node_free = cow(free.node_free)
            self.availability[class_name] = ClassAvailability(
                class_name=class_name, node_free=node_free.frozen(), free_in_cluster=free.total,
                served_in_cluster=free.served, free_on_best_node=free.best, best_node=free.best_node)
        self._moved.clear()
