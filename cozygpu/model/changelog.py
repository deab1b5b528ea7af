"""The change log of one model: which nodes, devices, VMIs and names its updates touched (kube-scheduler's
generations), and what a reader asks of it.

Contract: each key is in its log once, with the generation of its last touch, newest last; asking costs
what changed since, not the size of the fleet.
"""

from __future__ import annotations

from typing import TypeVar

import attrs

from cozygpu.model.views import DeviceKey, VmiKey


@attrs.frozen
class Changes:
    """What the updates after some generation touched: the nodes, devices and VMIs to judge again."""

    nodes: frozenset[str]
    devices: frozenset[DeviceKey]
    vmis: frozenset[VmiKey]
    #: Resource names whose room (a node's free units for new bookings) or whose availability for a class
    #: changed: where a Pending or Lost set of that name may find room it did not have.
    names: frozenset[str] = frozenset()
    #: Whether some tenant subtree's usage changed (a budget may have room, or a refusal new numbers).
    usage: bool = False


class ChangeLog:
    """Which nodes, devices and VMIs a model's updates touched, newest last (kube-scheduler's generations).

    Why: a reader that decided on an earlier snapshot of the same model asks
    what changed since, at the cost of what changed, instead of comparing
    every node and device. Each key is in the log once, with the generation
    of its last touch; the log is shared by every snapshot of one model (a
    rebuild logs what differs from the model before it, or says anything may
    have changed), so asking the newest snapshot about an
    old generation also names keys touched after the snapshot one holds: a
    superset, never less.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, int] = {}
        self.devices: dict[DeviceKey, int] = {}
        self.vmis: dict[VmiKey, int] = {}
        self.names: dict[str, int] = {}
        #: The last generation in which some tenant subtree's usage changed.
        self.usage = 0
        self._rebuilt = 0

    def rebuilt(self, generation: int) -> None:
        for log in (self.nodes, self.devices, self.vmis, self.names):
            log.clear()
        self._rebuilt = generation

    def since(self, generation: int) -> Changes | None:
        """The keys touched after ``generation``; None when the model was rebuilt since (everything changed)."""
        if generation < self._rebuilt:
            return None
        return Changes(nodes=_since(self.nodes, generation), devices=_since(self.devices, generation),
                       vmis=_since(self.vmis, generation), names=_since(self.names, generation),
                       usage=self.usage > generation)


_K = TypeVar("_K")


def touch(log: dict[_K, int], key: _K, generation: int) -> None:
    """Note that ``key`` changed in ``generation``: it moves to the newest end of its log."""
    log.pop(key, None)
    log[key] = generation


def _since(log: dict[_K, int], generation: int) -> frozenset[_K]:
    found: list[_K] = []
    for key in reversed(log):
        if log[key] <= generation:
            break
        found.append(key)
    return frozenset(found)
