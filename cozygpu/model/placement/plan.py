"""The plan: what one placement run decides, as values the binder writes (R-BIND-4..6).

Why values: the binder, the VMI webhook and the CLI read the same plan, and
nothing in this package writes; the binder turns each action into a status
write, in plan order.
"""

from __future__ import annotations

from typing import TypeVar

import attrs

from cozygpu.model.placement.compaction import Compaction
from cozygpu.model.refusals import Refusal
from cozygpu.model.snapshot import DeviceKey

SUCCEEDED = "Succeeded"
FAILED = "Failed"


@attrs.frozen(kw_only=True)
class Bind:
    """Bind (or move) a device onto a node: ``status.phase=Bound``, ``status.nodeName=node``."""

    device: DeviceKey
    node: str
    previous: str | None = None
    #: Why it moved off ``previous`` (None for a new bind, a rebind or a gather).
    cause: Refusal | None = None


@attrs.frozen(kw_only=True)
class MarkLost:
    """The device's node cannot keep it and no node has room: ``status.phase=Lost``, no node."""

    device: DeviceKey
    previous: str | None
    cause: Refusal


@attrs.frozen(kw_only=True)
class KeepPending:
    """An order that cannot be accepted now; it stays Pending with a condition saying why."""

    device: DeviceKey
    refusal: Refusal


@attrs.frozen(kw_only=True)
class Stay:
    """A set kept on its node despite a problem there (a cordon, R-BIND-6; its running VM, R-BIND-7).

    For conditions and the CLI; ``why`` says which.
    """

    devices: tuple[DeviceKey, ...]
    node: str
    cause: Refusal
    why: str


@attrs.frozen(kw_only=True)
class Answer:
    """The answer to a bind request, written into ``status.bindAnswer``."""

    device: DeviceKey
    request_id: str
    result: str
    node: str | None = None
    refusal: Refusal | None = None


Action = Bind | MarkLost | KeepPending | Stay | Answer
_A = TypeVar("_A", Bind, MarkLost, KeepPending, Stay, Answer)


@attrs.frozen(kw_only=True)
class PassPlan:
    actions: tuple[Action, ...]

    def of(self, kind: type[_A]) -> tuple[_A, ...]:
        """The actions of one kind, in plan order."""
        return tuple(a for a in self.actions if isinstance(a, kind))


@attrs.frozen(kw_only=True)
class SetPlacement:
    """Where a set would go (``node``), or why it cannot (``refusal``)."""

    node: str | None
    refusal: Refusal | None
    moves: tuple[Bind, ...] = ()
    #: The set stays on its cordoned node (R-BIND-6): a Succeeded answer says "stays", not "bound".
    stay: Stay | None = None
    #: The stopped holds moved to make room for the set (R-BIND-11); their Binds lead ``moves``.
    compaction: Compaction | None = None
