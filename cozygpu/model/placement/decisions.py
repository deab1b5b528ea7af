"""What the planner decides for a held set: keep its node, stay on it, move, or go Lost (R-BIND-5..7).

These are the planner's own answers, not plan actions: the rules
(``rules``) and the choice of a node (``choice``) return them, and the
cycle's state (``state``) turns them into Binds, MarkLosts and Stays. The
strings are a Stay's ``why``, which the binder's conditions and the CLI show.
"""

from __future__ import annotations

import attrs

from cozygpu.model.placement.compaction import Compaction
from cozygpu.model.refusals import Refusal


@attrs.frozen
class Keep:
    """The set keeps its node."""


@attrs.frozen(kw_only=True)
class StayPut:
    """The set stays on its node despite a problem there: a cordon (R-BIND-6) or its running VM (R-BIND-7)."""

    cause: Refusal
    why: str


@attrs.frozen(kw_only=True)
class Move:
    """The set goes to ``node``; ``cause`` is why it leaves the node it holds (None for a gather or a rebind).
    ``compaction``: the stopped holds that move off ``node`` first to make room (R-BIND-11)."""

    node: str
    cause: Refusal | None
    compaction: Compaction | None = None


@attrs.frozen(kw_only=True)
class GoLost:
    """No node has room: the held set goes Lost for ``cause``; a request for it is refused with ``no_room``."""

    cause: Refusal
    no_room: Refusal


Decision = Keep | StayPut | Move | GoLost
KEEP = Keep()
ON_CORDON_STAY = "onCordon: Stay"
NO_ROOM_ELSEWHERE = "no other node has room"
#: Why a set whose VMI has a running launcher keeps its node whatever the node's problem (R-BIND-7).
VM_RUNS_THERE = "its VM runs there"
#: Why a split set whose VMI runs is left split: its launcher's node, the only one it may go to, cannot take it.
SPLIT_WHILE_VM_RUNS = "its VM runs there and the node cannot take the rest of the set"
