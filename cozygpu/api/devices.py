"""A GPUDevice's JSON as the binder reads it, and the status patches the binder sends; pure.

Readers take the object as the cache holds it (or None) and return a typed
value: a missing or mistyped field reads as empty ("" / None / ()), never
raises. The builders (``Placement``, ``BindAnswer``, ``status_patch``) make
the ``status`` merge patch of one placement decision; each says whether a
device already carries what it would write, so a repeated decision writes
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import attrs

from cozygpu.api.conditions import find, of
from cozygpu.api.meta import Obj, section, spec, status, text
from cozygpu.api.times import parse_time, rfc3339
from cozygpu.model.snapshot import Ledger, Phase

# The phases' strings, read once (an enum member read through its class is slow on a hot path).
PENDING: Final = Phase.PENDING.value
BOUND: Final = Phase.BOUND.value
LOST: Final = Phase.LOST.value
#: The phases in which a device holds its class and its units (what budgets count).
HOLDING_PHASES: Final = frozenset({BOUND, LOST})


def phase(obj: Obj | None) -> str:
    """``status.phase`` ("" when unset: the device reads as Pending)."""
    return text(status(obj), "phase")


def node_name(obj: Obj | None) -> str:
    return text(status(obj), "nodeName")


def class_name(obj: Obj | None) -> str:
    return text(spec(obj), "className")


def count(obj: Obj | None) -> int | None:
    """``spec.count`` (None when missing or not an integer)."""
    value = spec(obj).get("count")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def holds(obj: Obj | None) -> bool:
    """The device holds its class: accepted by the binder (Bound or Lost)."""
    return phase(obj) in HOLDING_PHASES


def bound(obj: Obj | None) -> bool:
    return phase(obj) == BOUND


def condition_status(obj: Obj | None, kind: str) -> str:
    """The ``status`` of the device's condition of type ``kind`` ("True", "False", "Unknown"; "" when absent)."""
    found = find(of(obj), kind)
    return text(found, "status") if found is not None else ""


def ledger_fields(ledger: Ledger) -> dict[str, Any]:
    """The ``status`` fields of a hold's ledger (R-LEDGER-1): ``idleSince`` null while a VM runs on it."""
    return {"heldSince": rfc3339(ledger.held_since) if ledger.held_since is not None else None,
            "idleSince": rfc3339(ledger.idle_since) if ledger.idle_since is not None else None,
            "idleSeconds": round(ledger.idle_seconds)}


def held_since(obj: Obj | None) -> str:
    """``status.heldSince`` as written ("" when the ledger has not started: R-LEDGER-1)."""
    return text(status(obj), "heldSince")


def bind_request_id(obj: Obj | None) -> str:
    """The id of ``status.bindRequest`` ("" when there is none)."""
    return text(section(status(obj), "bindRequest"), "id")


def bind_answer_id(obj: Obj | None) -> str:
    return text(section(status(obj), "bindAnswer"), "id")


def answer_result(obj: Obj | None) -> str:
    """``status.bindAnswer.result`` ("" when there is no answer)."""
    return text(section(status(obj), "bindAnswer"), "result")


def answered(obj: Obj | None) -> bool:
    """The device carries a ``bindAnswer`` (whichever request it answers)."""
    return bool(status(obj).get("bindAnswer"))


def unanswered(obj: Obj | None) -> str:
    """The id of the device's bind request when no answer names it, or ""."""
    request = bind_request_id(obj)
    return "" if not request or bind_answer_id(obj) == request else request


def new_order(obj: Obj | None) -> bool:
    """Not accepted yet (no phase, or Pending) and carrying no answer."""
    return phase(obj) in ("", PENDING) and not answered(obj)


def attachment_vmi(obj: Obj | None) -> str:
    """The VMI named by ``status.attachment`` ("" when the device is not attached)."""
    return text(section(status(obj), "attachment"), "vmi")


def attachment_uid(obj: Obj | None) -> str:
    """The VMI UID the attachment recorded ("" when none was)."""
    return text(section(status(obj), "attachment"), "uid")


def attached_at(obj: Obj | None) -> datetime | None:
    """When the attachment was made (``attachedAt``; None when not attached, or not said)."""
    return parse_time(section(status(obj), "attachment").get("attachedAt"))


# -- the status patches of placement ---------------------------------------------------------------


@attrs.frozen
class Placement:
    """Where a decision puts a device: its phase and, when ``sets_node``, its node (None removes it)."""

    phase: str
    node: str | None = None
    sets_node: bool = True

    @classmethod
    def bound(cls, node: str) -> Placement:
        return cls(BOUND, node)

    @classmethod
    def lost(cls) -> Placement:
        return cls(LOST, None)

    @classmethod
    def pending(cls) -> Placement:
        """Pending, its node left as it is (an order not placed)."""
        return cls(PENDING, None, sets_node=False)

    def fields(self) -> dict[str, Any]:
        """The ``status`` fields this placement writes."""
        if not self.sets_node:
            return {"phase": self.phase}
        return {"phase": self.phase, "nodeName": self.node}

    def moves(self, obj: Obj | None) -> bool:
        """Writing it changes the device's phase or node."""
        current = status(obj)
        if current.get("phase") != self.phase:
            return True
        return self.sets_node and current.get("nodeName") != self.node


_ANSWER_FIELDS: Final = ("id", "result", "reason", "message", "node")


@attrs.frozen(kw_only=True)
class BindAnswer:
    """``status.bindAnswer``: the answer to bind request ``id``."""

    id: str
    result: str
    reason: str
    message: str
    node: str | None
    time: datetime

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "result": self.result, "reason": self.reason, "message": self.message,
                "node": self.node, "time": rfc3339(self.time)}

    def given(self, obj: Obj | None) -> bool:
        """The device carries this answer already (its time aside)."""
        have = status(obj).get("bindAnswer")
        if not isinstance(have, Mapping):
            return False
        return tuple(have.get(f) for f in _ANSWER_FIELDS) == (self.id, self.result, self.reason, self.message,
                                                               self.node)


def status_patch(*, placement: Placement | None = None, conditions: Sequence[Mapping[str, Any]] | None = None,
                 answer: BindAnswer | None = None, generation: int | None = None) -> dict[str, Any]:
    """The merge patch of a device's ``status``: the placement's fields, the whole conditions list (a
    list-map, which a merge patch replaces), the answer, and the generation the decision observed."""
    patch = placement.fields() if placement is not None else {}
    if conditions is not None:
        patch["conditions"] = list(conditions)
    if answer is not None:
        patch["bindAnswer"] = answer.as_json()
    if generation is not None:
        patch["observedGeneration"] = generation
    return patch
