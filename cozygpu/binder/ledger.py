"""What the ledger writes into a hold's status (R-LEDGER-1, R-LEDGER-2): pure, no I/O.

Contract:
- For each hold judged (a Bound device), one :class:`DeviceWrite` when its
  status must change: the ledger fields ``model.ledger.target`` says
  (``heldSince``, ``idleSince``, ``idleSeconds``), the ``IdleHoldExpiring``
  condition while its class's rule warns (with a Warning Event the first
  time), and, past the limit, the release: phase ``Released``, no node, the
  ``Bound`` condition False with reason ``IdleHoldExpired`` and a Warning
  Event. A hold whose status already says all that gets no write.
- Each write carries the resourceVersion of the object it was decided on;
  a refused one requeues the work, which decides again on a fresh view.
- A released device is left out of the read model (it holds nothing, counts
  against no budget, is never placed), so its units and budget free with the
  write; its hold claim and usage record go as any device's that holds
  nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

import attrs

from cozygpu.api import devices, meta
from cozygpu.api.conditions import Condition, comparable, find, merge, of, without
from cozygpu.api.times import rfc3339
from cozygpu.base.durations import format_duration
from cozygpu.binder.status import BOUND_CONDITION, NORMAL, WARNING, DeviceWrite, EventNote
from cozygpu.model import ledger
from cozygpu.model.snapshot import DeviceKey, DeviceView, Ledger, Phase, Snapshot

Obj = Mapping[str, Any]

EXPIRING_CONDITION: Final = "IdleHoldExpiring"
REASON_IDLE_LIMIT: Final = "IdleHoldLimit"
REASON_EXPIRED: Final = "IdleHoldExpired"
REASON_IN_USE: Final = "VMStarted"


def ledger_writes(snapshot: Snapshot, objects: Mapping[DeviceKey, Obj], judged: Iterable[DeviceKey], *,
                  now: datetime) -> list[DeviceWrite]:
    """The writes that bring each of ``judged`` in line with the ledger and its class's idle-hold rule (at the
    cost of the holds judged, not of the fleet)."""
    out: list[DeviceWrite] = []
    for key in sorted(set(judged)):
        device, obj = snapshot.devices.get(key), objects.get(key)
        if device is None or obj is None or not device.holds_units:
            continue
        write = hold_write(device, obj, running=ledger.runs(snapshot, device), snapshot=snapshot, now=now)
        if write is not None:
            out.append(write)
    return out


def hold_write(device: DeviceView, obj: Obj, *, running: bool, snapshot: Snapshot, now: datetime) -> DeviceWrite | None:
    """One hold's write (see the module contract), None when its status says it all already."""
    want = ledger.target(device, running, now)
    same = want == device.ledger  # the view is the object's: its status already says this ledger
    gpu_class = snapshot.classes.get(device.class_name)
    step = ledger.expiry(device if same else attrs.evolve(device, ledger=want), gpu_class, running, now)
    current = of(obj)
    if same and step is None and find(current, EXPIRING_CONDITION) is None:
        return None  # the common case, kept cheap: a whole judgement walks every hold
    patch: dict[str, Any] = {}
    events: list[EventNote] = []
    conditions = without(current, EXPIRING_CONDITION)
    units = f"{device.count} unit{'s' if device.count != 1 else ''}"
    if step is not None and step.step is ledger.Expiry.RELEASE:
        assert gpu_class is not None
        assert want.idle_since is not None
        idle = format_duration(round((now - want.idle_since).total_seconds()))  # whole seconds: "20s", not "20001ms"
        message = (f"released after {idle} idle (class {gpu_class.name}'s idleHoldLimit "
                   f"{format_duration(step.limit.total_seconds())}): its {units} on node {device.node_name} are "
                   f"free and its budget is no longer used; order again to hold GPUs")
        released = Ledger(held_since=want.held_since, idle_since=None,
                          idle_seconds=want.idle_seconds + (now - want.idle_since).total_seconds())
        patch.update(devices.Placement(Phase.RELEASED.value, None).fields())
        patch.update(devices.ledger_fields(released))
        patch["conditions"] = merge(conditions, [Condition(BOUND_CONDITION, False, REASON_EXPIRED, message)], now,
                                    generation=meta.generation(obj))
        events.append(EventNote(type=WARNING, reason=REASON_EXPIRED, message=message))
    else:
        if not same:
            patch.update(devices.ledger_fields(want))
        if step is not None:  # a warning
            assert gpu_class is not None
            assert want.idle_since is not None
            message = (f"idle since {rfc3339(want.idle_since)}: its {units} will be released at "
                       f"{rfc3339(step.at)} (class {gpu_class.name}'s idleHoldLimit "
                       f"{format_duration(step.limit.total_seconds())}); start its VM before then to keep them")
            warned = merge(current, [Condition(EXPIRING_CONDITION, True, REASON_IDLE_LIMIT, message)], now)
            if comparable(warned) != comparable(current):
                patch["conditions"] = warned
                if find(current, EXPIRING_CONDITION) is None:
                    events.append(EventNote(type=WARNING, reason=EXPIRING_CONDITION, message=message))
        elif len(conditions) != len(current):  # warned before; a VM started, or the rule changed
            patch["conditions"] = conditions
            if running:
                events.append(EventNote(type=NORMAL, reason=REASON_IN_USE,
                                        message="its VM runs: the hold is no longer idle and will not be released"))
    if not patch:
        return None
    return DeviceWrite(key=device.key, uid=meta.uid(obj), resource_version=meta.resource_version(obj), status=patch,
                       events=tuple(events))

