"""Read-only JSON: what the store hands out, so no caller can change an object for everyone.

Every object in the cache is shared: the binder, the webhooks and every handler
read the same instance. ``freeze`` turns a decoded JSON value into one that
refuses mutation, deeply:

- ``FrozenDict`` is a ``dict`` subclass and ``FrozenList`` a ``list`` subclass
  whose mutating methods raise ``TypeError``. They compare equal to plain dicts
  and lists, serialise with ``json.dumps`` and cost no more memory than the
  plain containers (``__slots__ = ()``), which is why they were chosen over
  ``types.MappingProxyType`` (a proxy object per nested dict) and over copying
  on every read (20,000 pods copied per binder pass).
- Keys, and short string values (label values, phases, container names), are
  interned, so 20,000 pods share one copy of ``"metadata"``, ``"Running"`` and
  ``"virt-launcher"``; this is most of why the cache fits its memory target.

Not a sandbox: ``dict.__setitem__(obj, k, v)`` still writes. The guard stops
accidents, not intent. To change an object, ``thaw`` it (a deep, mutable copy);
``copy.copy`` and ``copy.deepcopy`` of a frozen value return mutable copies too.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

#: Strings at most this long are interned (keys always are).
INTERN_MAX = 64


def _refuse(*_: object, **__: object) -> NoReturn:
    raise TypeError("cached objects are read-only; thaw() a copy to change it")


class FrozenDict(dict[str, Any]):
    """A JSON object from the cache: reads like a dict, refuses every write."""

    __slots__ = ()

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return thaw(self)  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (thaw(self),))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


class FrozenList(list[Any]):
    """A JSON array from the cache: reads like a list, refuses every write."""

    __slots__ = ()

    __setitem__ = _refuse
    __delitem__ = _refuse
    __iadd__ = _refuse
    __imul__ = _refuse
    append = _refuse
    extend = _refuse
    insert = _refuse
    pop = _refuse
    remove = _refuse
    clear = _refuse
    sort = _refuse
    reverse = _refuse

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return thaw(self)  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (thaw(self),))

    def __repr__(self) -> str:
        return f"FrozenList({list.__repr__(self)})"


_intern = sys.intern


def freeze(value: Any) -> Any:
    """A deep read-only copy of a decoded JSON value (already frozen parts are reused)."""
    if type(value) is dict:
        return _freeze_dict(value)
    if type(value) is list:
        return _freeze_list(value)
    if type(value) is str and len(value) <= INTERN_MAX:
        return _intern(value)
    if isinstance(value, FrozenDict | FrozenList):
        return value
    if isinstance(value, Mapping):
        return _freeze_dict(value)
    if isinstance(value, list | tuple):
        return _freeze_list(value)
    return value


def _freeze_dict(value: Mapping[str, Any]) -> FrozenDict:
    # Built as a plain dict and copied into the FrozenDict by dict's C-level init:
    # cheaper than one unbound ``dict.__setitem__`` call per key.
    out: dict[str, Any] = {}
    for key, item in value.items():
        t = type(item)
        if t is str:
            if len(item) <= INTERN_MAX:
                item = _intern(item)
        elif t is dict:
            item = _freeze_dict(item)
        elif t is list:
            item = _freeze_list(item)
        elif t is not int and t is not bool and t is not float and item is not None:
            item = freeze(item)
        out[_intern(key)] = item
    return FrozenDict(out)


def _freeze_list(value: Iterable[Any]) -> FrozenList:
    return FrozenList([freeze(item) for item in value])


def thaw(value: Any) -> Any:
    """A deep, mutable copy of a (frozen or plain) JSON value, made of plain dicts and lists."""
    if isinstance(value, dict):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list):
        return [thaw(item) for item in value]
    return value


def is_frozen(value: Any) -> bool:
    """Whether ``value`` is a container this module froze (scalars are always read-only)."""
    return isinstance(value, FrozenDict | FrozenList)
