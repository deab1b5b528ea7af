"""One planning run, and placing a set with new members: answers, new orders and the webhook's what-if.

Why one ``place``: an answer pass, a full pass and the VMI webhook's dry
check (``place_set``) answer a request alike wherever nothing earlier in the
plan changed what its answer reads. The run's pieces collaborate through
the one ``CycleState``: the rules (``rules``) decide for what a set holds,
the choice (``choice``) picks a node, and new orders first pass the checks
admission also makes (``order_problem``, R-BIND-6), against the snapshot
plus what this run already accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from cozygpu.model import refusals
from cozygpu.model.budgets import add_usage, demand_usage
from cozygpu.model.catalog import class_problem, order_refusal
from cozygpu.model.classes import count_problem
from cozygpu.model.placement.choice import Chooser
from cozygpu.model.placement.compaction import Compaction
from cozygpu.model.placement.decisions import SPLIT_WHILE_VM_RUNS, GoLost, Keep, Move, StayPut
from cozygpu.model.placement.nodes import NodeFilter
from cozygpu.model.placement.plan import SetPlacement, Stay
from cozygpu.model.placement.rules import Rules
from cozygpu.model.placement.sets import Work, launcher_node
from cozygpu.model.placement.state import CycleState
from cozygpu.model.refusals import Reason, Refusal
from cozygpu.model.snapshot import CompactionPolicy, DeviceView, Snapshot, Usage, VMIView
from cozygpu.model.tenants import ancestry


class Planner:
    """One planning run over a snapshot: its state and the pieces that read and write it, local to one call."""

    def __init__(self, snapshot: Snapshot, works: Sequence[Work] | None = None) -> None:
        self.s = snapshot
        self.state = CycleState(snapshot)
        self.nodes = NodeFilter(snapshot)
        self.choice = Chooser(self.state, self.nodes)
        self.rules = Rules(self.state, self.nodes, self.choice, works)

    def place(self, work: Work) -> SetPlacement:
        """Gather the whole set (held, Lost and new members) onto one node, or refuse.

        A set held whole on one node gets what :meth:`Rules.keep_or_move`
        decides for it with its new members: kept (new members join it there,
        or the whole set goes where they all fit), stayed on a cordon (new
        members join it there or are refused), moved, or refused when it
        would go Lost.
        """
        state = self.state
        pending = state.pending(work)
        if pending:
            problem = self.order_problem(work, pending)
            if problem is not None:
                return SetPlacement(node=None, refusal=problem)
        members = state.accepted(work) + pending
        if not members:
            return SetPlacement(node=None, refusal=refusals.no_node_for_set(work.label, needs="nothing", candidates=0))
        target = Work(label=work.label, vmi=work.vmi, members=members)
        held = state.held_node(target)
        classes = self.nodes.classes_of(target)
        if held is None or classes is None:
            going = self.choice.destination(target)
            split = state.held_part(target)
            if isinstance(going, GoLost) and split is not None and state.split_while_running(split):
                # As the restore step leaves it (R-BIND-7): the answer carries the same Stay.
                node = launcher_node(self.s, split) or ""
                stay = state.record_stay(split, node, StayPut(cause=going.no_room, why=SPLIT_WHILE_VM_RUNS))
                return SetPlacement(node=None, refusal=going.no_room, stay=stay)
            return self._settle(target, pending, going)
        held_part = state.held_part(target)
        assert held_part is not None
        decision = state.stayed(held_part) or self.rules.keep_or_move(target, held, classes)
        if isinstance(decision, Keep):
            if not pending:
                return SetPlacement(node=held, refusal=None)
            return self._settle(target, pending, self.choice.destination(target))
        if isinstance(decision, StayPut):
            stay = state.record_stay(held_part, held, decision)
            problem = self._room_on(target, held)
            if problem is not None:
                return SetPlacement(node=None, refusal=problem, stay=stay)
            return self._commit(target, pending, Move(node=held, cause=None), stay=stay)
        return self._settle(target, pending, decision)

    def _settle(self, work: Work, pending: Sequence[DeviceView], decision: Move | GoLost) -> SetPlacement:
        if isinstance(decision, GoLost):
            return SetPlacement(node=None, refusal=decision.no_room)
        return self._commit(work, pending, decision)

    def _commit(self, work: Work, pending: Sequence[DeviceView], decision: Move, stay: Stay | None = None
                ) -> SetPlacement:
        self.state.accept(pending)
        moves = self.state.carry_out(work, decision)
        return SetPlacement(node=decision.node, refusal=None, moves=tuple(moves), stay=stay,
                            compaction=decision.compaction)

    def _room_on(self, work: Work, node: str) -> Refusal | None:
        """Why the members joining a set that stays on ``node`` do not fit there (None when they do).

        What the set holds there stays whatever the node's free units say:
        the capacity-lost rule has already decided it is not to leave.
        """
        need, held_on = self.choice.demand(work)
        here = held_on.get(node, {})
        joining = {name: units - here.get(name, 0) for name, units in need.items() if units > here.get(name, 0)}
        if all(self.state.units.free(node, name) >= units for name, units in joining.items()):
            return None
        needs = ", ".join(f"{n} of {r}" for r, n in sorted(joining.items()))
        return refusals.no_node_for_set(work.label, needs=needs, candidates=1)

    def order_problem(self, work: Work, pending: Sequence[DeviceView]) -> Refusal | None:
        """Why new orders cannot be accepted now: their class, count and maxCount, then the budgets.

        The budgets count what this run already accepted (R-BIND-6).
        ``catalog.refusal_for`` follows the same order, so the webhook and
        the binder tell the same story.
        """
        demand: dict[str, int] = {}
        namespace = pending[0].namespace
        for device in pending:
            gpu_class = self.s.classes.get(device.class_name)
            if gpu_class is None:
                return refusals.unknown_class(device.class_name)
            problem = class_problem(self.s, device.namespace, gpu_class) or count_problem(gpu_class, device.count)
            if problem is not None:
                return problem
            demand[device.class_name] = demand.get(device.class_name, 0) + device.count
        return self.state.budget.refusal(namespace, demand)


def place_set(
    snapshot: Snapshot,
    members: Sequence[DeviceView],
    *,
    vmi: VMIView | None = None,
    label: str | None = None,
    count_pending: bool = False,
) -> SetPlacement:
    """Where this set would be placed now, or why not: the VMI webhook's dry check (R-ADM-2).

    ``members`` may include devices that do not exist yet (template devices
    about to be created, as Pending views). Nothing is written; the result
    is what an answer pass would decide on the same snapshot.

    ``count_pending`` (the admission check, R-MOD-4): budgets also count the
    tenant subtree's orders not yet accepted, as the GPUDevice webhook does
    (``catalog.order_refusal``), so a start cannot jump ahead of an earlier
    admitted order under the same budget; the set's own Pending members are
    counted once, as members, not again among those orders.
    """
    if not members:
        raise ValueError("a set has at least one member")
    first = members[0]
    name = label or (f"VMI {vmi.namespace}/{vmi.name}" if vmi else f"GPUDevice {first.namespace}/{first.name}")
    planner = Planner(snapshot)
    if count_pending:
        planner.state.budget.extra = _pending_besides(snapshot, members)
    return planner.place(Work(label=name, vmi=vmi, members=list(members)))


@attrs.frozen(kw_only=True)
class OrderCheck:
    """The GPUDevice admission check with compaction (R-ADM-1, R-BIND-11): why the order cannot be met now,
    or how it will be (``compaction`` when stopped holds must move first)."""

    refusal: Refusal | None
    compaction: Compaction | None = None


def order_check(snapshot: Snapshot, namespace: str, class_name: str, count: int, *, label: str = "") -> OrderCheck:
    """``catalog.order_refusal``, and for an order refused only because no node has room for it, the
    compaction that makes room or a refusal that says moving every stopped hold would not do.

    The count is compared with maxCount, the budgets and the class's free units before any plan is sought, so
    it never sizes the work."""
    refusal = order_refusal(snapshot, namespace, class_name, count)
    gpu_class = snapshot.classes.get(class_name)
    if refusal is None or refusal.reason is not Reason.NO_NODE_WITH_ROOM or gpu_class is None \
            or gpu_class.compaction is CompactionPolicy.NEVER:
        return OrderCheck(refusal=refusal)
    planner = Planner(snapshot)
    order = DeviceView(namespace=namespace, name=label or "(order)", class_name=class_name, count=count)
    work = Work(label=f"GPUDevice {namespace}/{order.name}", vmi=None, members=[order])
    move = planner.choice.compact(work)
    if move is not None and move.compaction is not None:
        return OrderCheck(refusal=None, compaction=move.compaction)
    node, most = planner.choice.most_after_moves(work)
    available = snapshot.availability.get(class_name)
    if available is None or most <= available.free_on_best_node:
        return OrderCheck(refusal=refusal)  # nothing may move that would help: the plain refusal says it all
    return OrderCheck(refusal=refusals.no_node_even_after_compaction(
        class_name, free_in_cluster=available.free_in_cluster if available is not None else 0, best_free=most,
        best_node=node, requested=count))


def _pending_besides(snapshot: Snapshot, members: Sequence[DeviceView]) -> dict[str, Usage]:
    """The subtrees' orders not yet accepted (R-MOD-4), less the set's own Pending members."""
    extra = dict(snapshot.pending_usage)
    for member in members:
        known = snapshot.devices.get(member.key)
        if known is None or known.accepted or known.deleting:
            continue
        own = demand_usage({known.class_name: known.count}, snapshot.classes)
        less = Usage(per_class={k: -n for k, n in own.per_class.items()}, total=-own.total,
                     raw={k: -n for k, n in own.raw.items()})
        for tenant in ancestry(known.namespace):
            if tenant in extra:
                extra[tenant] = add_usage(extra[tenant], less)
    return extra
