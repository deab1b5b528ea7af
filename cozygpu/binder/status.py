"""What a plan writes into GPUDevice status, set by set (R-BIND-4..6): pure, no I/O.

Why: the model decides (``plan_pass``) and says nothing of JSON; this module
turns its actions into the status each device must carry and the Events a
person reads, so ``writes.py`` only sends them.

Contract:
- One :class:`DeviceWrite` per device whose status changes: a merge patch of
  ``status`` (``phase``, ``nodeName``, ``bindAnswer``, the ``Bound``
  condition, ``observedGeneration``) carrying the resourceVersion of the
  object the decision was made on. A device whose status would not change
  gets no write, so a pass that repeats a decision (an order still waiting,
  a set staying on a cordoned node) writes nothing and raises no Event.
- Writes are grouped in :class:`SetWrite`s, one per set of ``device_sets``,
  in the plan's order (restores, moves, rebinds, answers, new orders).
- The conditions list is rewritten whole: it is a list-map, which a merge
  patch replaces, and the precondition guarantees it is the list we read
  (``api.conditions.merge``, with the generation the decision observed).
- The device is read, and its patch built, through ``cozygpu.api.devices``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

import attrs

from cozygpu.api import devices, meta
from cozygpu.api.conditions import Condition, comparable, merge, of
from cozygpu.model.placement import (
    SPLIT_WHILE_VM_RUNS,
    SUCCEEDED,
    VM_RUNS_THERE,
    Action,
    Answer,
    Bind,
    KeepPending,
    MarkLost,
    PassPlan,
    Stay,
    device_sets,
)
from cozygpu.model.refusals import Reason, Refusal
from cozygpu.model.snapshot import DeviceKey, Ledger, Phase, Snapshot

Obj = Mapping[str, Any]

BOUND_CONDITION: Final = "Bound"
#: Reasons of the Bound condition and of the Events (CamelCase, like Kubernetes reasons).
REASON_BOUND: Final = "Bound"
REASON_REBOUND: Final = "Rebound"
REASON_MOVED: Final = "Moved"
REASON_GATHERED: Final = "Gathered"
REASON_LOST: Final = "Lost"
REASON_NOT_ACCEPTED: Final = "NotAccepted"
REASON_STAYS: Final = "StaysOnCordonedNode"
REASON_STAYS_RUNNING: Final = "StaysWhileVMRuns"
REASON_SPLIT_RUNNING: Final = "SplitWhileVMRuns"

NORMAL: Final = "Normal"
WARNING: Final = "Warning"


@attrs.frozen(kw_only=True)
class EventNote:
    """A core/v1 Event to raise on the device once its write succeeded."""

    type: str
    reason: str
    message: str


@attrs.frozen(kw_only=True)
class DeviceWrite:
    key: DeviceKey
    uid: str
    #: The resourceVersion the decision was made on: the write's precondition (R-BIND-2).
    resource_version: str
    #: The merge patch of ``status`` (a null removes a field).
    status: Mapping[str, Any]
    events: tuple[EventNote, ...] = ()


@attrs.frozen(kw_only=True)
class SetWrite:
    """The writes of one set: sent together, dropped together on a conflict (R-BIND-4)."""

    label: str
    devices: tuple[DeviceWrite, ...]
    #: Every member held no units and is bound now: the set frees nothing a later set of the plan could have
    #: counted on, so its writes may go out alongside other such sets' (the patcher's ``Write.alongside``).
    takes_only: bool = False


@attrs.define
class _Decided:
    """Everything the plan says about one device, folded (a later Bind or MarkLost wins)."""

    place: Bind | MarkLost | None = None
    cause: Refusal | None = None
    pending: KeepPending | None = None
    stay: Stay | None = None
    answer: Answer | None = None


def _gather_refused(cause: Refusal | None) -> bool:
    """A loss's cause that is only a set's want of room on one node (R-BIND-4's gather), no reason to leave."""
    return cause is not None and cause.reason is Reason.NO_NODE_WITH_ROOM


def _fold(actions: Iterable[Action]) -> dict[DeviceKey, _Decided]:
    decided: dict[DeviceKey, _Decided] = {}
    for action in actions:
        if isinstance(action, Stay):
            for key in action.devices:
                decided.setdefault(key, _Decided()).stay = action
            continue
        entry = decided.setdefault(action.device, _Decided())
        if isinstance(action, Bind | MarkLost):
            if isinstance(action, Bind) and action.cause is None and _gather_refused(entry.cause):
                # Sent Lost earlier in this plan only because its split set found no room to gather, then
                # placed with its set: a gather, whose condition says so (not the room it lacked a moment ago).
                entry.cause = None
            else:
                entry.cause = action.cause or entry.cause
            entry.place = action
        elif isinstance(action, KeepPending):
            entry.pending = action
        else:
            entry.answer = action
    return decided


def _condition(status: bool, reason: str, message: str) -> Condition:
    return Condition(BOUND_CONDITION, status, reason, message)


def _placement(
    decided: _Decided, phase: Phase, node: str | None, set_label: str
) -> tuple[devices.Placement | None, Condition | None, list[EventNote]]:
    """The placement, the Bound condition and the Events of one device's decision."""
    placement: devices.Placement | None = None
    events: list[EventNote] = []
    condition: Condition | None = None
    place = decided.place
    if isinstance(place, Bind):
        placement = devices.Placement.bound(place.node)
        if phase is Phase.BOUND and node and node != place.node and decided.cause is not None:
            message = f"moved from node {node} to node {place.node}: {decided.cause.message}"
            condition = _condition(True, REASON_MOVED, message)
        elif phase is Phase.BOUND and node and node != place.node:
            message = f"moved from node {node} to node {place.node} to join the rest of {set_label}"
            condition = _condition(True, REASON_GATHERED, message)
        elif phase is Phase.LOST:
            condition = _condition(True, REASON_REBOUND, f"rebound on node {place.node} after it was Lost")
        else:
            condition = _condition(True, REASON_BOUND, f"bound on node {place.node}")
        events.append(EventNote(type=NORMAL, reason=condition.reason, message=condition.message))
    elif isinstance(place, MarkLost):
        placement = devices.Placement.lost()
        where = f"node {place.previous}" if place.previous else "its node"
        message = f"lost {where}: {place.cause.message}; it holds no units until a node has room"
        condition = _condition(False, REASON_LOST, message)
        events.append(EventNote(type=WARNING, reason=REASON_LOST, message=message))
    elif decided.pending is not None:
        refusal = decided.pending.refusal
        placement = devices.Placement.pending()  # SPEC 1.2: an order not placed is Pending, whatever the reason
        condition = _condition(False, refusal.reason.value, f"not accepted: {refusal.message}")
        events.append(EventNote(type=WARNING, reason=REASON_NOT_ACCEPTED, message=condition.message))
    elif decided.stay is not None:
        stay = decided.stay
        if stay.why == SPLIT_WHILE_VM_RUNS:
            message = (f"{set_label} is split and its VM runs on node {stay.node}, so no member the VM uses is moved; "
                       f"the set is gathered there once the node can take it: {stay.cause.message}")
            condition = _condition(phase is Phase.BOUND, _stay_reason(stay), message)
            events.append(EventNote(type=WARNING, reason=condition.reason, message=message))
        else:
            message = f"stays on node {stay.node} ({stay.why}): {stay.cause.message}"
            condition = _condition(True, _stay_reason(stay), message)
            events.append(EventNote(type=NORMAL, reason=condition.reason, message=message))
    return placement, condition, events


def _stay_reason(stay: Stay) -> str:
    if stay.why == SPLIT_WHILE_VM_RUNS:
        return REASON_SPLIT_RUNNING
    return REASON_STAYS_RUNNING if stay.why == VM_RUNS_THERE else REASON_STAYS


def _answer(decided: _Decided, now: datetime) -> devices.BindAnswer | None:
    answer = decided.answer
    if answer is None:
        return None
    if answer.result == SUCCEEDED:
        reason = _stay_reason(decided.stay) if decided.stay is not None else REASON_BOUND
        message = f"the set is held on node {answer.node}"
    else:
        assert answer.refusal is not None
        reason, message = answer.refusal.reason.value, answer.refusal.message
    return devices.BindAnswer(id=answer.request_id, result=answer.result, reason=reason, message=message,
                              node=answer.node, time=now)


def device_write(
    key: DeviceKey, decided: _Decided, obj: Obj, *, phase: Phase, node: str | None, set_label: str, now: datetime
) -> DeviceWrite | None:
    generation = meta.generation(obj)
    placement, condition, events = _placement(decided, phase, node, set_label)
    conditions: list[dict[str, Any]] | None = None
    changed_condition = False
    if condition is not None:
        current = of(obj)
        conditions = merge(current, [condition], now, generation=generation)
        changed_condition = comparable(conditions) != comparable(current)
    changed_place = placement is not None and placement.moves(obj)
    answer = _answer(decided, now)
    if not (changed_place or changed_condition or (answer is not None and not answer.given(obj))):
        return None
    patch = devices.status_patch(placement=placement, conditions=conditions, answer=answer, generation=generation)
    if placement is not None and placement.phase == devices.BOUND and not devices.held_since(obj):
        # R-LEDGER-1: held from this first bind, and idle until a VM runs on it (the ledger work says when).
        patch.update(devices.ledger_fields(Ledger(held_since=now, idle_since=now)))
    # Events only for what changed: a repeated decision raises none.
    kept = tuple(events) if changed_place or changed_condition else ()
    return DeviceWrite(key=key, uid=meta.uid(obj), resource_version=meta.resource_version(obj), status=patch,
                       events=kept)


def plan_writes(plan: PassPlan, snapshot: Snapshot, objects: Mapping[DeviceKey, Obj], *,
                now: datetime) -> tuple[SetWrite, ...]:
    """The status writes of ``plan``, one group per set, in plan order.

    ``objects`` are the raw GPUDevices the snapshot was built from: their
    resourceVersions are the preconditions, their status the base of the patch.
    """
    decided = _fold(plan.actions)
    set_of: dict[DeviceKey, tuple[str, tuple[DeviceKey, ...]]] = {}
    for device_set in device_sets(snapshot):
        for member in device_set.members:
            set_of[member] = (device_set.label, device_set.members)
    order: list[tuple[str, tuple[DeviceKey, ...]]] = []
    for action in plan.actions:
        for key in action.devices if isinstance(action, Stay) else (action.device,):
            group = set_of.get(key, (f"GPUDevice {key[0]}/{key[1]}", (key,)))
            if group not in order:
                order.append(group)
    writes: list[SetWrite] = []
    # A cycle's view plans some sets, but a compaction moves holds outside them (R-BIND-11): read every device.
    every = snapshot.every_device if snapshot.every_device is not None else snapshot.devices
    for label, members in order:
        found = []
        takes_only = True
        for key in members:
            view, entry = every.get(key), decided.get(key)
            if view is None or entry is None:
                continue
            write = device_write(key, entry, objects[key], phase=view.phase, node=view.node_name,
                                 set_label=label, now=now)
            if write is not None:
                found.append(write)
                takes_only = takes_only and not view.holds_units and isinstance(entry.place, Bind)
        if found:
            writes.append(SetWrite(label=label, devices=tuple(found), takes_only=takes_only))
    return tuple(writes)
