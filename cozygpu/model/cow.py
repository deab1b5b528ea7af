"""Maps that snapshots share: a change costs what changed, not the size of the map.

The read model hands out snapshots that never change, and keeps patching its
own maps as events come in. Copying a map before patching it (what a
snapshot's immutability would otherwise take) costs the whole map: 10,000
devices or nodes copied for one new order. ``CowMap`` instead keeps the
changes since its last *compaction* in a small dict on top of a base dict that
is never written again once a snapshot holds it; ``frozen()`` hands out the
two as an immutable ``Layered`` mapping (or the bare base, when nothing is on
top), and a change after that copies only the small dict. Once the changes on
top outgrow the square root of the map, they are folded into a fresh base
(one whole copy per that many changes): an update costs O(√n), amortized,
where a copy costs O(n), and a read costs two dict lookups.

Iteration order is the base's, then the changes' (a dict's insertion order
means nothing to any reader of the model: they sort where order matters).
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterator, Mapping, MutableMapping, ValuesView
from typing import Any, Final, TypeVar, cast, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")

#: Not in the changes on top: look in the base.
_ABSENT: Final = object()
#: Taken away since the base.
_GONE: Final = object()
#: Changes on top kept up to this many before ``√len`` takes over.
_FLOOR: Final = 32


def _find(base: dict[Any, Any], over: dict[Any, Any], key: object) -> object:
    found = over.get(key, _ABSENT)
    if found is _ABSENT:
        return base.get(key, _ABSENT)
    return _ABSENT if found is _GONE else found


def _keys(base: dict[Any, Any], over: dict[Any, Any]) -> Iterator[Any]:
    if not over:
        yield from base
        return
    for key in base:
        if key not in over:
            yield key
    for key, value in over.items():
        if value is not _GONE:
            yield key


def _items(base: dict[Any, Any], over: dict[Any, Any]) -> Iterator[tuple[Any, Any]]:
    if not over:
        yield from base.items()
        return
    for item in base.items():
        if item[0] not in over:
            yield item
    for item in over.items():
        if item[1] is not _GONE:
            yield item


class _Items(ItemsView[K, V]):
    def __init__(self, base: dict[K, V], over: dict[K, object], length: int) -> None:
        self._base, self._over, self._len = base, over, length

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[tuple[K, V]]:
        return _items(self._base, self._over)

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        found = _find(self._base, self._over, item[0])
        return found is not _ABSENT and bool(found == item[1])


class _Values(ValuesView[V]):
    def __init__(self, base: dict[Any, V], over: dict[Any, object], length: int) -> None:
        self._base, self._over, self._len = base, over, length

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[V]:
        return (value for _, value in _items(self._base, self._over))


class _Layers(Mapping[K, V]):
    """Reading a base dict with the changes on top of it (what ``Layered`` and ``CowMap`` share)."""

    __slots__ = ("_base", "_len", "_over")

    _base: dict[K, V]
    _over: dict[K, object]
    _len: int

    def __getitem__(self, key: K) -> V:
        found = _find(self._base, self._over, key)
        if found is _ABSENT:
            raise KeyError(key)
        return cast("V", found)

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, /, default: V | D) -> V | D: ...
    def get(self, key: K, /, default: object = None) -> object:
        found = _find(self._base, self._over, key)
        return default if found is _ABSENT else found

    def __contains__(self, key: object) -> bool:
        return _find(self._base, self._over, key) is not _ABSENT

    def __iter__(self) -> Iterator[K]:
        return _keys(self._base, self._over)

    def __len__(self) -> int:
        return self._len

    def items(self) -> ItemsView[K, V]:
        return _Items(self._base, self._over, self._len)

    def values(self) -> ValuesView[V]:
        return _Values(self._base, self._over, self._len)


class Layered(_Layers[K, V]):
    """An immutable mapping: a base dict and the changes on top of it, neither ever written again."""

    __slots__ = ()

    def __init__(self, base: dict[K, V], over: dict[K, object], length: int) -> None:
        self._base, self._over, self._len = base, over, length

    def __repr__(self) -> str:
        return f"Layered({dict(self.items())!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Copied or pickled as the plain map it is: the markers of what was taken away are this process's.
        return (_layered, (dict(self.items()),))


def _layered(items: dict[K, V]) -> Layered[K, V]:
    return Layered(items, {}, len(items))


class CowMap(_Layers[K, V], MutableMapping[K, V]):
    """The model's own side of a map it shares with its snapshots (see the module docstring)."""

    __slots__ = ("_owned", "_view")

    def __init__(self, base: dict[K, V] | None = None) -> None:
        """Take ``base`` over: whoever built it writes it no more."""
        self._base: dict[K, V] = base if base is not None else {}
        self._over: dict[K, object] = {}
        self._len = len(self._base)
        #: Whether ``_over`` is this map's alone (a view handed out shares it until the next change).
        self._owned = True
        self._view: Mapping[K, V] | None = None

    @classmethod
    def on(cls, frozen: Mapping[K, V]) -> CowMap[K, V]:
        """A map to change, starting from one that ``frozen()`` handed out (or any dict never written again)."""
        made: CowMap[K, V] = cls()
        if isinstance(frozen, Layered):
            made._base, made._over, made._len, made._owned = frozen._base, frozen._over, frozen._len, False
        elif isinstance(frozen, dict):
            made._base, made._len = frozen, len(frozen)
        else:
            made._base, made._len = dict(frozen), len(frozen)
        made._view = frozen
        return made

    def _changing(self) -> dict[K, object]:
        if not self._owned:
            self._over = self._over.copy()
            self._owned = True
        self._view = None
        return self._over

    def __setitem__(self, key: K, value: V) -> None:
        if _find(self._base, self._over, key) is _ABSENT:
            self._len += 1
        self._changing()[key] = value

    def __delitem__(self, key: K) -> None:
        if _find(self._base, self._over, key) is _ABSENT:
            raise KeyError(key)
        over = self._changing()
        if key in self._base:
            over[key] = _GONE
        else:
            del over[key]
        self._len -= 1

    def __reduce__(self) -> tuple[Any, ...]:
        return (CowMap, (dict(self.items()),))

    def frozen(self) -> Mapping[K, V]:
        """The map as it is now, never to change: the same object until the next change."""
        if self._view is None:
            if len(self._over) > max(_FLOOR, math.isqrt(self._len)):
                base = self._base.copy()
                for key, value in self._over.items():
                    if value is _GONE:
                        del base[key]
                    else:
                        base[key] = cast("V", value)
                self._base, self._over, self._owned = base, {}, True
            if self._over:
                self._view = Layered(self._base, self._over, self._len)
                self._owned = False
            else:
                self._view = self._base
        return self._view
