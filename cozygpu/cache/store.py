"""The store: one kind's objects by key, with named indexes. Safe on one event loop, not across threads.

Contract for readers:
- **Do not mutate what you get.** Every object is a ``FrozenDict`` (see
  ``frozen.py``) shared with every other reader; writes raise ``TypeError``.
  ``thaw()`` a copy to build a patch. Lists returned by ``list`` and
  ``by_index`` are fresh, so sorting them is fine.
- **Eventually consistent.** The store reflects the API server as of
  ``resource_version``: it lags the server by the watch's latency, and a relist
  replaces the whole content at once (objects deleted while disconnected
  disappear, new ones appear, in one step with no await in between).
- **Consistent with itself.** Reads are synchronous and the only writer is the
  informer's task on the same loop, so between two awaits the objects and
  every index agree.
- No order: ``list`` and ``by_index`` return objects in no particular order.

Indexes: an indexer maps an object to the index values it is filed under
(``fn(obj) -> Iterable[str]``); ``by_index(name, value)`` returns every object
filed under ``value``. Indexers must be pure functions of the object; an
exception in one fails the write (the informer logs it and retries), so a bad
indexer is loud rather than silently incomplete. ``NAMESPACE`` is built in for
namespaced kinds; ``index_labels`` and ``index_field`` make common ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Literal

import attrs

from cozygpu.cache.frozen import FrozenDict

#: ``(namespace, name)``; the namespace is ``""`` for cluster-scoped objects.
Key = tuple[str, str]
IndexFunc = Callable[[FrozenDict], Iterable[str]]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]

_List = list  # ``Store.list`` shadows the builtin inside the class body

#: The built-in index of namespaced kinds: ``by_index(NAMESPACE, "tenant-a")``.
NAMESPACE: Final = "namespace"
#: The conventional name for ``index_labels``: values are ``"key=value"``.
LABELS: Final = "labels"


@attrs.frozen(slots=True)
class Event:
    """One change to the store, as handlers see it.

    ``obj`` is the new state (for DELETED, the last state seen; after a relist,
    the state before the object vanished). ``old`` is the previous state, or
    ``None`` for ADDED.
    """

    kind: str
    type: EventType
    obj: FrozenDict
    old: FrozenDict | None = None


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta["name"])


def resource_version_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def index_namespace(obj: FrozenDict) -> Iterable[str]:
    namespace = (obj.get("metadata") or {}).get("namespace")
    return (namespace,) if namespace else ()


def index_labels(obj: FrozenDict) -> Iterable[str]:
    """Files an object under ``"key=value"`` for each of its labels."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return [f"{key}={value}" for key, value in labels.items()]


def index_field(*path: str) -> IndexFunc:
    """An indexer filing an object under the string at ``path`` (absent or empty: not filed)."""

    def indexer(obj: FrozenDict) -> Iterable[str]:
        value: Any = obj
        for part in path:
            if not isinstance(value, dict):
                return ()
            value = value.get(part)
        return (value,) if isinstance(value, str) and value else ()

    indexer.__name__ = f"index_{'_'.join(path)}"
    return indexer


class Store:
    """One kind's objects and indexes (see the module contract)."""

    def __init__(self, kind: str, indexers: Mapping[str, IndexFunc] | None = None) -> None:
        self.kind = kind
        self._indexers: dict[str, IndexFunc] = dict(indexers or {})
        self._objects: dict[Key, FrozenDict] = {}
        self._indices: dict[str, dict[str, set[Key]]] = {name: {} for name in self._indexers}
        #: The last resourceVersion the informer saw for this kind (list, event or bookmark).
        self.resource_version: str = ""

    # -- reads ----------------------------------------------------------------------------

    def get(self, namespace: str | None, name: str) -> FrozenDict | None:
        """The object ``namespace/name`` (``None`` namespace for cluster-scoped kinds), or None."""
        return self._objects.get((namespace or "", name))

    def list(self, namespace: str | None = None) -> _List[FrozenDict]:
        """Every object, or every object in ``namespace``."""
        if namespace is None:
            return list(self._objects.values())
        if NAMESPACE in self._indices:
            return self.by_index(NAMESPACE, namespace)
        return [obj for (ns, _), obj in self._objects.items() if ns == namespace]

    def by_index(self, index: str, value: str) -> _List[FrozenDict]:
        """Every object the indexer ``index`` files under ``value``."""
        try:
            keys = self._indices[index].get(value, ())
        except KeyError:
            raise KeyError(f"{self.kind}: no index {index!r}; have {sorted(self._indices)}") from None
        objects = self._objects
        return [objects[key] for key in keys]

    def index_values(self, index: str) -> _List[str]:
        """Every value that at least one object is filed under in ``index``."""
        try:
            return list(self._indices[index])
        except KeyError:
            raise KeyError(f"{self.kind}: no index {index!r}; have {sorted(self._indices)}") from None

    @property
    def indexes(self) -> frozenset[str]:
        return frozenset(self._indexers)

    def keys(self) -> _List[Key]:
        return list(self._objects)

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, key: object) -> bool:
        return key in self._objects

    def __iter__(self) -> Iterator[FrozenDict]:
        return iter(list(self._objects.values()))

    def get_by_key(self, key: Key) -> FrozenDict | None:
        return self._objects.get(key)

    # -- writes (the informer's task only) ------------------------------------------------

    def upsert(self, obj: FrozenDict) -> Event:
        """Store ``obj`` (ADDED or MODIFIED) and re-file it in every index."""
        key = key_of(obj)
        filed = self._file_values(obj)  # first: an indexer that raises leaves the store unchanged
        old = self._objects.get(key)
        if old is not None:
            self._unindex(key, old)
        self._index(key, filed, self._indices)
        self._objects[key] = obj
        return Event(self.kind, "ADDED" if old is None else "MODIFIED", obj, old)

    def delete(self, obj: FrozenDict) -> Event | None:
        """Remove the object with ``obj``'s key; None when it was not stored."""
        key = key_of(obj)
        old = self._objects.pop(key, None)
        if old is None:
            return None
        self._unindex(key, old)
        return Event(self.kind, "DELETED", obj, old)

    def replace(self, objects: Iterable[FrozenDict], resource_version: str) -> _List[Event]:
        """Make ``objects`` the whole content, atomically, and return the differences as events.

        An object whose resourceVersion did not change yields no event; one that
        vanished yields DELETED with its last state. Indexes are rebuilt from scratch.
        """
        fresh: dict[Key, FrozenDict] = {}
        for obj in objects:
            fresh[key_of(obj)] = obj
        indices: dict[str, dict[str, set[Key]]] = {name: {} for name in self._indexers}
        for key, obj in fresh.items():
            self._index(key, self._file_values(obj), indices)
        events: _List[Event] = []
        previous = self._objects
        for key, obj in fresh.items():
            old = previous.get(key)
            if old is None:
                events.append(Event(self.kind, "ADDED", obj, None))
            elif old is not obj and resource_version_of(old) != resource_version_of(obj):
                events.append(Event(self.kind, "MODIFIED", obj, old))
        for key, old in previous.items():
            if key not in fresh:
                events.append(Event(self.kind, "DELETED", old, old))
        self._objects = fresh
        self._indices = indices
        self.resource_version = resource_version
        return events

    def clear(self) -> None:
        self._objects = {}
        self._indices = {name: {} for name in self._indexers}
        self.resource_version = ""

    # -- indexes --------------------------------------------------------------------------

    def _file_values(self, obj: FrozenDict) -> _List[tuple[str, Iterable[str]]]:
        return [(name, tuple(indexer(obj))) for name, indexer in self._indexers.items()]

    @staticmethod
    def _index(key: Key, filed: _List[tuple[str, Iterable[str]]], indices: dict[str, dict[str, set[Key]]]) -> None:
        for name, values in filed:
            index = indices[name]
            for value in values:
                bucket = index.get(value)
                if bucket is None:
                    index[value] = {key}
                else:
                    bucket.add(key)

    def _unindex(self, key: Key, obj: FrozenDict) -> None:
        for name, indexer in self._indexers.items():
            index = self._indices[name]
            for value in indexer(obj):
                bucket = index.get(value)
                if bucket is not None:
                    bucket.discard(key)
                    if not bucket:
                        del index[value]
