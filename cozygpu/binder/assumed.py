"""The binder's own placement writes, read back until the cache shows them (R-BIND-2)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from cozygpu.api import meta
from cozygpu.cache.informer import resource_version_at_least
from cozygpu.cache.store import Store
from cozygpu.kube import errors
from cozygpu.kube.client import Obj
from cozygpu.model.snapshot import DeviceKey


def object_key(obj: Mapping[str, Any]) -> DeviceKey:
    """(namespace, name) of an object ("" for a missing part)."""
    return meta.key(obj)


class Assumed:
    """The binder's own placement writes, read back until the cache shows them (R-BIND-2; kube-scheduler's
    assume, then bind without waiting for the watch).

    A written device's answer (the object the server stored) is *assumed*: the read model and the next
    cycle's preconditions read it instead of the store's older copy, so the next placement cycle need
    not wait for the watch to echo the write. The store's copy ends the assumption once it is as new
    (the write confirmed) or newer (someone wrote after it), or gone. Only a write the server took is
    assumed: a refused one (409, gone) never was, so there is nothing to forget.
    """

    def __init__(self, store: Callable[[], Store]) -> None:
        self._store = store
        self._written: dict[DeviceKey, Obj] = {}

    def __len__(self) -> int:
        return len(self._written)

    def add(self, key: DeviceKey, answer: Obj) -> None:
        self._written[key] = answer

    def clear(self) -> None:
        self._written.clear()

    def get(self, namespace: str, name: str) -> Obj | None:
        """The device as the binder last knows it: its own write until the store shows that or newer."""
        found = self._store().get(namespace, name)
        written = self._written.get((namespace, name))
        if written is None:
            return found
        if found is None or resource_version_at_least(meta.resource_version(found), meta.resource_version(written)):
            del self._written[(namespace, name)]  # confirmed, superseded, or gone
            return found
        return written

    def pending(self) -> list[Obj]:
        """The writes assumed now (some may be confirmed already: a superset)."""
        return list(self._written.values())

    def objects(self) -> Sequence[Obj]:
        listed = self._store().list()
        if not self._written:
            return listed
        return [found for obj in listed if (found := self.get(*object_key(obj))) is not None]


class DevicesAsWritten(Mapping[DeviceKey, Obj]):
    """The GPUDevice store as a mapping by key, the binder's own writes assumed: what a pass reads of the
    raw devices (and the resourceVersions its writes are preconditioned on), without copying them."""

    def __init__(self, store: Store, assumed: Assumed) -> None:
        self._store = store
        self._assumed = assumed

    def __getitem__(self, key: DeviceKey) -> Obj:
        found = self._assumed.get(*key)
        if found is None:
            raise KeyError(key)
        return found

    def __iter__(self) -> Iterator[DeviceKey]:
        return iter([object_key(o) for o in self._store.list()])

    def __len__(self) -> int:
        return len(self._store)


class StaleWrites(errors.Conflict):
    """Some writes of the pass were refused on their resourceVersion: the pass is requeued, not failed."""

    def __init__(self, count: int) -> None:
        self.count = count
        super().__init__(409, {"reason": "Conflict", "message": f"{count} write(s) refused on the resourceVersion "
                               "they were decided on; the pass runs again from a fresh view"})
