"""Where a set goes: the fullest node with room, else Lost (R-BIND-5, R-BIND-7).

kube-scheduler's scoring, for a set: among the nodes that may take it
(``nodes``) with enough free units for every resource name it needs
(``units``), the nodes already holding members come first (fewest units
moved), then the one left with the fewest units free; ties break by node
name, so two planners on the same snapshot choose the same node. A set
whose VM runs may go to its launcher's node only. ``destination`` is the one
place a full pass and the answer path ask where a set goes. A set that holds
nothing yet and finds no node with room may still go where moving stopped
holds makes room (``compact``, R-BIND-11).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from cozygpu import keys
from cozygpu.model import refusals
from cozygpu.model.placement.compaction import Hold, plan_compaction
from cozygpu.model.placement.decisions import GoLost, Move
from cozygpu.model.placement.nodes import NodeFilter
from cozygpu.model.placement.sets import Work, launcher_node, running
from cozygpu.model.placement.state import CycleState
from cozygpu.model.refusals import Refusal
from cozygpu.model.snapshot import CompactionPolicy, DeviceKey, DraGroup, Phase


class Chooser:
    """The choice of a node for a set, against what the run has booked so far."""

    def __init__(self, state: CycleState, nodes: NodeFilter) -> None:
        self.s = state.s
        self.state = state
        self.units = state.units
        self.nodes = nodes

    def demand(self, work: Work) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """Units the set needs per resource name, and the units it already holds per node."""
        need: dict[str, int] = {}
        held_on: dict[str, dict[str, int]] = {}
        for device in work.members:
            name = self.state.resource(device)
            assert name is not None
            need[name] = need.get(name, 0) + device.count
            phase, node = self.state.where(device)
            if phase is Phase.BOUND and node:
                per = held_on.setdefault(node, {})
                per[name] = per.get(name, 0) + device.count
        return need, held_on

    def choose(self, work: Work, *, exclude: Iterable[str] = (),
               only: str | None = None) -> tuple[str | None, Refusal | None]:
        """The node for the whole set (``only`` that one, when given), or why there is none."""
        classes = self.nodes.classes_of(work)
        if classes is None:
            missing = next(d.class_name for d in work.members if d.class_name not in self.s.classes)
            return None, refusals.unknown_class(missing)
        need, held_on = self.demand(work)
        names = sorted(need)
        skip = set(exclude)
        candidates = self.nodes.eligible(work, classes, names)
        if only is not None:
            if only not in candidates:
                problem = self.nodes.node_problem(work, only, classes)
                if problem is None:
                    missing = ", ".join(n for n in names if only not in self.s.serving.get(n, ()))
                    problem = refusals.no_node_for_set(work.label, needs=missing or ", ".join(names), candidates=0)
                return None, problem
            candidates = (only,)
        units = self.units
        # Nothing held yet and a name no node has room for: no need to look.
        hopeless = not held_on and any(need[name] > units.max_free(name) for name in names)
        if not held_on and len(names) == 1 and not hopeless:  # a new set of one name: the room buckets
            node = units.fullest(names[0], need[names[0]], candidates, skip)
            best: tuple[int, int, str] | None = (0, 0, node) if node is not None else None
        else:
            best = None
        # The hot loop of a set that holds units already, or of several names: kept inline.
        for node in () if hopeless or (not held_on and len(names) == 1) else candidates:
            if node in skip:
                continue
            here = held_on.get(node)
            leftover = 0
            held_units = 0
            for name in names:
                already = here.get(name, 0) if here else 0
                room = units.free(node, name) - need[name] + already
                if room < 0:
                    break
                leftover += room
                held_units += already
            else:
                score = (-held_units, leftover, node)
                if best is None or score < best:
                    best = score
        if best is None:
            needs = ", ".join(f"{need[n]} of {n}" for n in names)
            return None, refusals.no_node_for_set(work.label, needs=needs, candidates=len(candidates))
        return best[2], None

    def destination(self, work: Work, *, leaving: str | None = None, cause: Refusal | None = None) -> Move | GoLost:
        """Choose a node, else Lost: the fullest node with room other than ``leaving``.

        ``cause`` is why the set leaves ``leaving`` (None for a gather or a
        rebind, where a Lost set is lost for want of room).
        """
        if running(self.s, work):
            # R-BIND-7: a set whose VM runs may go to its launcher's node only (the member the VM uses is there).
            launcher = launcher_node(self.s, work)
            if launcher is None:
                refused = refusals.vm_runs_on(work.label, node=None, why=None)
                return GoLost(cause=cause or refused, no_room=refused)
            only, why = self.choose(work, only=launcher)
            if only is not None:
                return Move(node=only, cause=cause)
            refused = refusals.vm_runs_on(work.label, node=launcher, why=why)
            return GoLost(cause=cause or refused, no_room=refused)
        node, no_room = self.choose(work, exclude=(leaving,) if leaving else ())
        if node is not None:
            return Move(node=node, cause=cause)
        assert no_room is not None
        if leaving is None:
            compacted = self.compact(work)
            if compacted is not None:
                return compacted
        return GoLost(cause=cause or no_room, no_room=no_room)

    def compact(self, work: Work) -> Move | None:
        """The set onto a node that moving stopped holds makes room on (R-BIND-11), or None: when the set
        holds units already, needs more than one class, its class never compacts, or no plan exists. A DRA
        class's moved holds' claims are allocated again like any moved set's; with a ``matchAttribute`` the
        room is made in one group of a node (``Snapshot.dra_groups``), by moving holds of that group."""
        classes = self.nodes.classes_of(work)
        if classes is None or len(classes) != 1:
            return None
        [gpu_class] = classes
        if gpu_class.compaction is CompactionPolicy.NEVER:
            return None
        need, held_on = self.demand(work)
        largest = max((size for size, _ in self.s.stopped_hold_sizes.get(gpu_class.name, ())), default=0)
        if held_on or len(need) != 1 or largest == 0:
            return None
        [(name, units)] = need.items()
        candidates = self.nodes.eligible(work, classes, [name])
        # A moved hold needs only its class's nodes (no VMI of its own constrains it).
        destinations = self.nodes.eligible(Work(label=work.label, vmi=None, members=work.members[:1]), classes,
                                           [name])
        nodes = candidates if destinations is candidates else {*candidates, *destinations}
        free = {node: self.units.free(node, name) for node in nodes}
        movable = self._movable_in(work, gpu_class.name)
        if gpu_class.dra is not None and gpu_class.dra.match_attribute:
            sites = self._groups(candidates, name)
            plan = plan_compaction(need=units, free=free, candidates=sites, destinations=destinations,
                                   largest=largest, movable=lambda site: movable(*sites[site]),
                                   room={site: group.free for site, (_, group) in sites.items()},
                                   node_of=lambda site: sites[site][0])
        else:
            plan = plan_compaction(need=units, free=free, candidates=candidates, destinations=destinations,
                                   largest=largest, movable=lambda node: movable(node, None))
        return Move(node=plan.node, cause=None, compaction=plan) if plan is not None else None

    def most_after_moves(self, work: Work) -> tuple[str | None, int]:
        """The node with the most units free once every stopped hold on it that may move has moved, and how
        many (what a refusal after compaction quotes; a walk of the class's nodes, on a refusal only). With a
        ``matchAttribute``, the most in one group of a node."""
        classes = self.nodes.classes_of(work)
        need, _ = self.demand(work)
        if classes is None or len(need) != 1:
            return None, 0
        [name] = need
        [gpu_class, *_] = classes
        movable = self._movable_in(work, gpu_class.name)
        candidates = self.nodes.eligible(work, classes, [name])
        sites: dict[str, tuple[str, DraGroup | None]] = (
            dict(self._groups(candidates, name)) if gpu_class.dra is not None and gpu_class.dra.match_attribute
            else {node: (node, None) for node in candidates})
        best: tuple[int, str] | None = None
        for node, group in sites.values():
            here = group.free if group is not None else self.units.free(node, name)
            most = max(here, 0) + sum(count for _, count in movable(node, group))
            if best is None or (-most, node) < (-best[0], best[1]):
                best = (most, node)
        return (best[1], best[0]) if best is not None else (None, 0)

    def _groups(self, candidates: Iterable[str], name: str) -> dict[str, tuple[str, DraGroup]]:
        """The candidates' groups of ``name`` (a DRA offer with a ``matchAttribute``), by a site id of their own."""
        groups = self.s.dra_groups
        return {f"{node}/{group.value}": (node, group) for node in candidates
                for group in groups.get(node, {}).get(name, ())}

    def _movable_in(self, work: Work, class_name: str) -> Callable[[str, DraGroup | None], list[Hold]]:
        """``_movable`` for one plan: the order's own members never move, the namespaces' labels are read once,
        and within a group only its holds."""
        ordering = {device.key for device in work.members}
        opted_out: dict[str, bool] = {}

        def movable(node: str, group: DraGroup | None) -> list[Hold]:
            holds = self._movable(node, class_name, ordering, opted_out)
            return holds if group is None else [hold for hold in holds if hold[0] in group.holds]

        return movable

    def _movable(self, node: str, class_name: str, ordering: set[DeviceKey],
                 opted_out: dict[str, bool]) -> list[Hold]:
        """The holds on ``node`` compaction may move: Bound devices of the class attached to no VMI, with no
        start asking for them, in a namespace that did not opt out (R-BIND-11). ``opted_out`` memoizes the
        namespaces' labels for one plan. Called for the few nodes a plan visits (``plan_compaction``'s bound), and
        for every eligible node only on a refusal (``most_after_moves``)."""
        out: list[Hold] = []
        s = self.s
        devices = s.every_device if s.every_device is not None else s.devices
        moved = self.state.phases
        for key in s.devices_by_node.get(node, ()):
            device = devices.get(key)
            if device is None or device.class_name != class_name or device.attachment is not None \
                    or device.template or device.deleting or key in ordering or device.unanswered_request:
                continue
            if moved.get(key, (device.phase, device.node_name)) != (Phase.BOUND, node):
                continue
            out_of_it = opted_out.get(device.namespace)
            if out_of_it is None:
                namespace = s.namespaces.get(device.namespace)
                out_of_it = opted_out[device.namespace] = namespace is not None and \
                    namespace.labels.get(keys.COMPACTION_LABEL) == CompactionPolicy.NEVER
            if not out_of_it:
                out.append((key, device.count))
        return out
