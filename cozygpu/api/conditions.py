"""One condition merge and one comparison, for every condition cozygpu writes (metav1.Condition's shape)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import attrs

from cozygpu.api.meta import Obj, items, status
from cozygpu.api.times import rfc3339


@attrs.frozen
class Condition:
    """A condition a writer wants (its transition time and observedGeneration are the merge's)."""

    type: str
    status: bool
    reason: str
    message: str

    def as_json(self) -> dict[str, Any]:
        return {"type": self.type, "status": "True" if self.status else "False", "reason": self.reason,
                "message": self.message}


def of(obj: Obj | None) -> tuple[Mapping[str, Any], ...]:
    """An object's ``status.conditions`` (the mappings of it)."""
    return items(status(obj).get("conditions"))


def find(current: object, kind: str) -> Mapping[str, Any] | None:
    """The condition of type ``kind`` in a conditions list, or None."""
    return next((c for c in items(current) if c.get("type") == kind), None)


def without(current: object, kind: str) -> list[dict[str, Any]]:
    """A conditions list with the condition of type ``kind`` taken out (the others as they are, in order)."""
    return [dict(c) for c in items(current) if c.get("type") != kind]


def merge(current: object, wanted: Sequence[Condition], now: datetime, *,
          generation: int | None = None) -> list[dict[str, Any]]:
    """``current`` with each ``wanted`` condition in its place (others kept, in their order; new ones last).

    A transition time moves only when the status does; ``observedGeneration``
    is set to ``generation`` when the writer knows which generation it judged.
    """
    existing = [dict(c) for c in items(current)]
    fresh: list[dict[str, Any]] = []
    for condition in wanted:
        entry = condition.as_json()
        if generation is not None:
            entry["observedGeneration"] = generation
        old = next((c for c in existing if c.get("type") == condition.type), None)
        kept = old is not None and old.get("status") == entry["status"] and old.get("lastTransitionTime")
        entry["lastTransitionTime"] = old["lastTransitionTime"] if kept and old is not None else rfc3339(now)
        if old is None:
            fresh.append(entry)
        else:
            existing[existing.index(old)] = entry
    return [*existing, *fresh]


_COMPARED = ("type", "status", "reason", "message", "observedGeneration")


def comparable(conditions: object) -> list[tuple[object, ...]]:
    """What a condition list says, transition times aside, in a stable order: equal lists say the same."""
    return sorted((tuple(c.get(f) for f in _COMPARED) for c in items(conditions)), key=str)
