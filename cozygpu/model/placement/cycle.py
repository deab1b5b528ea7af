"""What one binder pass does, step by step in the order of R-BIND-5.

restore set invariants -> move held sets off nodes that cannot keep them ->
rebind Lost sets -> answer bind requests -> bind new orders (oldest first);
an answer pass does only the answers (R-BIND-3). Each step is a function
over the sets and one ``Planner``, so a later step sees what the earlier
ones booked. ``resulting_states`` reads a plan back as device states.
"""

from __future__ import annotations

from collections.abc import Sequence

from cozygpu.model.placement.decisions import SPLIT_WHILE_VM_RUNS, GoLost, Move, StayPut
from cozygpu.model.placement.plan import FAILED, SUCCEEDED, Answer, Bind, KeepPending, MarkLost, PassPlan
from cozygpu.model.placement.planner import Planner
from cozygpu.model.placement.sets import Work, device_sets, launcher_node, work_of
from cozygpu.model.snapshot import DeviceKey, Phase, Snapshot


def plan_pass(snapshot: Snapshot, *, answers_only: bool = False) -> PassPlan:
    """Everything one binder pass decides, in the order of R-BIND-5 (or only the answers, R-BIND-3).

    The binder always plans the whole order, on the sets whose inputs changed
    (``cycle_view``); ``answers_only`` plans the answers alone, which the
    model's tests use to hold R-BIND-3's answer rules apart.
    """
    works = [work_of(snapshot, s) for s in device_sets(snapshot)]
    planner = Planner(snapshot, works)
    if not answers_only:
        _restore_sets(planner, works)
        _move_off(planner, works)
        _rebind_lost(planner, works)
    answered = _answer_requests(planner, works)
    if not answers_only:
        _bind_new_orders(planner, [w for w in works if id(w) not in answered])
    return PassPlan(actions=tuple(planner.state.actions))


def _restore_sets(planner: Planner, works: Sequence[Work]) -> None:
    """R-BIND-4: a set partly Lost or split over nodes is gathered onto one node or sent to Lost whole.

    R-BIND-7: a set whose VM runs is gathered onto its launcher's node only
    (``destination``), the members held there staying put; when that node
    cannot take the rest the set is left as it is, with a ``Stay`` saying why,
    and never sent to Lost.

    A set split by a start (its members attached to the VMI the webhook is admitting, on two nodes) is
    not restored: the answer to its request gathers it or refuses the start (R-BIND-6), and a start
    refused leaves its members where they held, until the webhook takes the attachments back
    (``start_refused``). Sending them Lost would cost the tenant holds for a start that never ran.
    """
    state = planner.state
    for work in works:
        whole = state.held_part(work)
        if whole is None or len(whole.members) < 2:
            continue
        if any(d.unanswered_request for d in work.members) or start_refused(work):
            continue
        if len({state.where(d) for d in whole.members}) > 1:
            decision = planner.choice.destination(whole)
            if isinstance(decision, GoLost) and state.split_while_running(whole):
                node = launcher_node(planner.s, whole) or ""
                state.record_stay(whole, node, StayPut(cause=decision.no_room, why=SPLIT_WHILE_VM_RUNS))
                continue
            state.carry_out(whole, decision)


def start_refused(work: Work) -> bool:
    """The set's start was refused: its VMI does not exist and a member's answer to the request that attached
    it is Failed. The webhook refused the VMI and takes its attachments back; until then its members are
    no set."""
    if work.vmi is not None:
        return False
    return any(d.attachment is not None and d.attachment.request_id and d.bind_answer is not None
               and d.bind_answer.id == d.attachment.request_id and d.bind_answer.result == FAILED
               for d in work.members)


def _move_off(planner: Planner, works: Sequence[Work]) -> None:
    """Move held sets off nodes that cannot keep them: the one rule of ``keep_or_move``, in two steps.

    First each set's node (``node_rule``), then, over the sets every node
    keeps, its capacity (``capacity_victims``), so that the sets moved off
    for a node problem are gone before a deficit is counted. A Stay is
    written only for a set still on its node after both.
    """
    state = planner.state
    kept: dict[str, list[Work]] = {}
    stays: list[tuple[Work, str, StayPut]] = []
    for work in works:
        whole = state.held_part(work)
        node = state.held_node(whole) if whole is not None else None
        classes = planner.nodes.classes_of(whole) if whole is not None else None
        if whole is None or node is None or classes is None:
            continue
        decision = planner.rules.node_rule(whole, node, classes)
        if isinstance(decision, Move | GoLost):
            state.carry_out(whole, decision)
            continue
        kept.setdefault(node, []).append(whole)
        if isinstance(decision, StayPut):
            stays.append((whole, node, decision))
    for node in sorted(kept):
        for victim, cause in planner.rules.capacity_victims(node, kept[node]):
            state.carry_out(victim, planner.choice.destination(victim, leaving=node, cause=cause))
    for whole, node, stay in stays:
        if state.held_node(whole) == node:
            state.record_stay(whole, node, stay)


def _rebind_lost(planner: Planner, works: Sequence[Work]) -> None:
    """A set wholly Lost (before this pass) is rebound on the fullest node with room; else it stays Lost."""
    state = planner.state
    for work in works:
        whole = state.held_part(work)
        if whole is None or any(state.where(d)[0] is not Phase.LOST for d in whole.members):
            continue
        if any(d.key in state.lost_now for d in whole.members):
            continue
        state.carry_out(whole, planner.choice.destination(whole))


def _answer_requests(planner: Planner, works: Sequence[Work]) -> set[int]:
    state = planner.state
    answered: set[int] = set()
    for work in works:
        # A request unanswered on any member is answered on every member that carries it, so a set
        # whose answer was written half way (a crash between members) ends with one answer, not two.
        asked = {d.bind_request.id for d in work.members if d.unanswered_request and d.bind_request is not None}
        requests = [d for d in work.members if d.bind_request is not None and d.bind_request.id in asked]
        if not requests:
            continue
        answered.add(id(work))
        placement = planner.place(work)
        for device in requests:
            assert device.bind_request is not None
            state.actions.append(
                Answer(
                    device=device.key,
                    request_id=device.bind_request.id,
                    result=SUCCEEDED if placement.refusal is None else FAILED,
                    node=placement.node,
                    refusal=placement.refusal,
                )
            )
        if placement.refusal is not None:
            for device in state.pending(work):
                state.actions.append(KeepPending(device=device.key, refusal=placement.refusal))
    return answered


def _bind_new_orders(planner: Planner, works: Sequence[Work]) -> None:
    state = planner.state
    waiting = [(w, state.pending(w)) for w in works]
    ordered = sorted(
        ((w, p) for w, p in waiting if p),
        key=lambda item: (min((d.created.timestamp() if d.created else 0.0) for d in item[1]), item[0].label),
    )
    for work, pending in ordered:
        placement = planner.place(work)
        if placement.refusal is not None:
            for device in pending:
                state.actions.append(KeepPending(device=device.key, refusal=placement.refusal))


def resulting_states(snapshot: Snapshot, plan: PassPlan) -> dict[DeviceKey, tuple[Phase, str | None]]:
    """Every device's (phase, node) after the plan's actions are written."""
    states = {k: (d.phase, d.node_name) for k, d in snapshot.devices.items()}
    for action in plan.actions:
        if isinstance(action, Bind):
            states[action.device] = (Phase.BOUND, action.node)
        elif isinstance(action, MarkLost):
            states[action.device] = (Phase.LOST, None)
    return states
