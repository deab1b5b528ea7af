"""Which nodes may take a set: R-MOD-8 for every member's class and the set's VMI together.

kube-scheduler's filter, for a set: ``node_problem`` says why one node may
not take it, a cordon only when nothing worse is found (a cordon alone may
keep a held set, R-BIND-6); ``eligible`` is every node that may, serving
every resource name the set needs. Eligibility reads only the snapshot, so
it is cached for the run by what decides it (classes and VMI constraints).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from cozygpu.model.eligibility import node_problem
from cozygpu.model.placement.sets import Work
from cozygpu.model.refusals import Reason, Refusal
from cozygpu.model.snapshot import GPUClassView, Snapshot, Toleration


class NodeFilter:
    """The eligibility of nodes for the sets of one planning run."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.s = snapshot
        self._eligible_cache: dict[tuple[object, ...], frozenset[str]] = {}

    def classes_of(self, work: Work) -> list[GPUClassView] | None:
        found: dict[str, GPUClassView] = {}
        for device in work.members:
            gpu_class = self.s.classes.get(device.class_name)
            if gpu_class is None:
                return None
            found[gpu_class.name] = gpu_class
        return [found[name] for name in sorted(found)]

    def _tolerations(self, work: Work, classes: Sequence[GPUClassView]) -> tuple[Toleration, ...]:
        held: list[Toleration] = list(work.vmi.tolerations) if work.vmi is not None else []
        for gpu_class in classes:
            held.extend(gpu_class.tolerations)
        return tuple(held)

    def node_problem(self, work: Work, node: str, classes: Sequence[GPUClassView]) -> Refusal | None:
        view = self.s.nodes.get(node)
        tolerations = self._tolerations(work, classes)
        node_selector = work.vmi.node_selector if work.vmi is not None else None
        affinity = work.vmi.node_affinity if work.vmi is not None else None
        problem: Refusal | None = None
        selectors = [c.node_selector for c in classes] or [None]
        for selector in selectors:
            found = node_problem(
                view,
                node_name=node,
                tolerations=tolerations,
                selector=selector,
                node_selector=node_selector,
                node_affinity=affinity,
            )
            if found is not None and found.reason is not Reason.NODE_CORDONED:
                return found
            problem = problem or found
        return problem

    def eligible(self, work: Work, classes: Sequence[GPUClassView], names: Sequence[str]) -> Collection[str]:
        """Nodes that may take the set: eligible for every class and serving every needed name."""
        vmi = work.vmi
        plain = vmi is None or (not vmi.tolerations and not vmi.node_selector and vmi.node_affinity is None)
        if plain and len(classes) == 1:
            available = self.s.availability.get(classes[0].name)
            return available.node_free.keys() if available is not None else ()
        cache_key: tuple[object, ...] = (
            tuple(c.name for c in classes),
            tuple(vmi.tolerations) if vmi is not None else (),
            tuple(sorted(vmi.node_selector.items())) if vmi is not None else (),
            vmi.node_affinity if vmi is not None else None,
        )
        cached = self._eligible_cache.get(cache_key)
        if cached is not None:
            return cached
        candidates = set(self.s.serving.get(names[0], ())) if names else set()
        for name in names[1:]:
            candidates &= set(self.s.serving.get(name, ()))
        result = frozenset(n for n in candidates if self.node_problem(work, n, classes) is None)
        self._eligible_cache[cache_key] = result
        return result
