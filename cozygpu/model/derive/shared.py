"""What every part of the model's tables uses: per-key tallies, sorted key tuples, and the update's stamp.

Contract: pure; nothing here knows a Snapshot's fields.
"""

from __future__ import annotations

import bisect
from collections.abc import Generator, Mapping, MutableMapping
from typing import Final, TypeVar

from cozygpu.model.cow import CowMap
from cozygpu.model.snapshot import ChangeLog, DeviceKey

_K = TypeVar("_K")
_V = TypeVar("_V")
_R = TypeVar("_R")

#: Items a derivation in steps (``ModelTables.rebuilding``) does between two of them: well under a ms each.
STEP: Final = 128


def drain(steps: Generator[None, None, _R]) -> _R:
    """Run steps to their end, at once: their value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            value: _R = done.value
            return value


class Stamp:
    """The change being applied: its generation, and the log every part notes what it moved in."""

    __slots__ = ("generation", "log")

    def __init__(self) -> None:
        self.log = ChangeLog()
        self.generation = 0


class Tally:
    """Sums per key with the number of contributions to each: a key is present while anything contributes."""

    __slots__ = ("counts", "sums")

    def __init__(self) -> None:
        self.sums: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def add(self, key: str, amount: int, contributions: int) -> int:
        """Add ``amount`` and ``contributions``; returns +1 when the key appeared, -1 when it went, else 0."""
        before = self.counts.get(key, 0)
        after = before + contributions
        if after:
            self.counts[key] = after
            self.sums[key] = self.sums.get(key, 0) + amount
        else:
            self.counts.pop(key, None)
            self.sums.pop(key, None)
        return (after > 0) - (before > 0)

    def __bool__(self) -> bool:
        return bool(self.counts)


def tally_into(tallies: dict[str, Tally], at: str, amounts: Mapping[str, int], sign: int) -> None:
    """Add (+1) or take away (-1) ``amounts`` at ``at``'s tally; a tally nothing contributes to goes."""
    tally = tallies.get(at)
    if tally is None:
        tally = tallies[at] = Tally()
    for key, n in amounts.items():
        tally.add(key, sign * n, sign)
    if not tally:
        del tallies[at]


def add_key(index: MutableMapping[_K, tuple[DeviceKey, ...]], bucket: _K, key: DeviceKey) -> None:
    """``key`` into its bucket's sorted tuple (a new tuple: a snapshot may hold the old one)."""
    found = index.get(bucket, ())
    at = bisect.bisect_left(found, key)
    if at < len(found) and found[at] == key:
        return
    index[bucket] = found[:at] + (key,) + found[at:]  # noqa: RUF005 -- joined slices cost a third of unpacking


def drop_key(index: MutableMapping[_K, tuple[DeviceKey, ...]], bucket: _K, key: DeviceKey) -> None:
    """``key`` out of its bucket's sorted tuple; an empty bucket goes."""
    found = index.get(bucket, ())
    at = bisect.bisect_left(found, key)
    if at == len(found) or found[at] != key:
        return
    rest = found[:at] + found[at + 1:]
    if rest:
        index[bucket] = rest
    else:
        del index[bucket]


def cow(mapping: MutableMapping[_K, _V]) -> CowMap[_K, _V]:
    """The map as a ``CowMap``, for a Snapshot to hold: a part builds its maps as plain dicts, which no
    Snapshot holds until the first one is handed out, and shares them from then on."""
    if isinstance(mapping, CowMap):
        return mapping
    return CowMap(mapping if isinstance(mapping, dict) else dict(mapping))


def frozen(mapping: Mapping[_K, _V]) -> Mapping[_K, _V]:
    """What a Snapshot holds of one of the model's maps: its view, never to change."""
    return mapping.frozen() if isinstance(mapping, CowMap) else mapping
