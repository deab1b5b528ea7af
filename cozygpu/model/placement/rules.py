"""Whether a held set keeps its node: the one rule, ``keep_or_move`` (R-BIND-5, R-BIND-6, R-BIND-7).

Its node first (``node_rule``): a problem other than a cordon moves the set;
a cordon alone keeps it as a Stay when a member's class says ``onCordon:
Stay`` or no other node has room. Then its node's capacity
(``capacity_victims``): on a node whose fresh report serves fewer units than
are held and used, sets leave larger first until it fits. A set whose VM
runs is never moved or sent to Lost: it stays (``its VM runs there``) and
the capacity rule passes it over. A full pass applies the two rules in two
steps over every set; ``keep_or_move`` is the same decision for one set.
"""

from __future__ import annotations

from collections.abc import Sequence

from cozygpu.model import refusals
from cozygpu.model.placement.choice import Chooser
from cozygpu.model.placement.decisions import (
    KEEP,
    NO_ROOM_ELSEWHERE,
    ON_CORDON_STAY,
    VM_RUNS_THERE,
    Decision,
    GoLost,
    Keep,
    StayPut,
)
from cozygpu.model.placement.nodes import NodeFilter
from cozygpu.model.placement.sets import Work, device_sets, running, work_of
from cozygpu.model.placement.state import CycleState
from cozygpu.model.refusals import Reason, Refusal
from cozygpu.model.snapshot import GPUClassView, OnCordon


class Rules:
    """The keep-or-move rules for the held sets of one planning run."""

    def __init__(self, state: CycleState, nodes: NodeFilter, choice: Chooser, works: Sequence[Work] | None) -> None:
        self.s = state.s
        self.state = state
        self.nodes = nodes
        self.choice = choice
        self._works = works

    def works(self) -> Sequence[Work]:
        """Every set of the snapshot (built on first use: only the capacity-lost rule needs them all)."""
        if self._works is None:
            self._works = [work_of(self.s, s) for s in device_sets(self.s)]
        return self._works

    def node_rule(self, work: Work, node: str, classes: Sequence[GPUClassView]) -> Decision:
        """What the set's node itself decides (R-BIND-5, R-BIND-6): keep, stay on a cordon, move or Lost."""
        problem = self.nodes.node_problem(work, node, classes)
        if problem is None:
            return KEEP
        if running(self.s, work):
            return StayPut(cause=problem, why=VM_RUNS_THERE)
        if problem.reason is not Reason.NODE_CORDONED:
            return self.choice.destination(work, leaving=node, cause=problem)
        if any(c.on_cordon is OnCordon.STAY for c in classes):
            return StayPut(cause=problem, why=ON_CORDON_STAY)
        decision = self.choice.destination(work, leaving=node, cause=problem)
        if isinstance(decision, GoLost):
            return StayPut(cause=problem, why=NO_ROOM_ELSEWHERE)
        return decision

    def capacity_victims(self, node: str, kept: Sequence[Work]) -> list[tuple[Work, Refusal]]:
        """The capacity-lost rule: which of the sets ``kept`` on ``node`` leave it, and why.

        Per resource name (sorted) whose fresh report serves fewer units than
        are held and used: larger sets first, then by label, until what is
        left fits; a set whose VMI has a running launcher never leaves
        (R-BIND-7), so a node may stay over its capacity. A set leaving frees
        all its names. Nothing is written; the caller moves the sets in order.
        """
        entries = self.s.capacity.get(node, {})
        resource = self.state.resource
        leaving: list[tuple[Work, Refusal]] = []
        gone: set[int] = set()
        freed: dict[str, int] = {}
        for name in sorted(entries):
            entry = entries[name]
            deficit = -(self.state.units.kept(node, name) + freed.get(name, 0))
            if not entry.fresh or deficit <= 0:
                continue
            cause = refusals.capacity_lost(node, resource_name=name, served=entry.served, in_use=entry.served + deficit)
            holding = [
                (w, sum(d.count for d in w.members if resource(d) == name)) for w in kept if id(w) not in gone
            ]
            ranked = sorted(
                ((w, units) for w, units in holding if units > 0 and not running(self.s, w)),
                key=lambda item: (-item[1], item[0].label),
            )
            for work, units in ranked:
                if deficit <= 0:
                    break
                leaving.append((work, cause))
                gone.add(id(work))
                for device in work.members:
                    held = resource(device)
                    if held is not None:
                        freed[held] = freed.get(held, 0) + device.count
                deficit -= units
        return leaving

    def keep_or_move(self, work: Work, node: str, classes: Sequence[GPUClassView]) -> Decision:
        """The one keep-or-move policy for a set held whole on ``node``: its node, then its node's capacity.

        A full pass applies the same two rules in two steps over every set
        (``cycle._move_off``); this is the same decision for one set, as the
        answer path needs it.
        """
        decision = self.node_rule(work, node, classes)
        if isinstance(decision, Keep | StayPut):
            cause = self._capacity_cause(work, node)
            if cause is not None:
                return self.choice.destination(work, leaving=node, cause=cause)
        return decision

    def _capacity_cause(self, work: Work, node: str) -> Refusal | None:
        """Why the capacity-lost rule takes this set off ``node``, if it does."""
        names = {self.state.resource(d) for d in work.members}
        if all(self.state.units.kept(node, name) >= 0 for name in names if name is not None):
            return None
        mine = {d.key for d in work.members}
        kept: list[Work] = []
        for other in self.works():
            whole = self.state.held_part(other)
            if whole is None or self.state.held_node(whole) != node:
                continue
            classes = self.nodes.classes_of(whole)
            if classes is not None and isinstance(self.node_rule(whole, node, classes), Keep | StayPut):
                kept.append(whole)
        for victim, cause in self.capacity_victims(node, kept):
            if mine & {d.key for d in victim.members}:
                return cause
        return None
