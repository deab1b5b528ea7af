"""The read model of a process: one live snapshot of its cache, read by the webhooks and the binder alike.

Why one: each replica serves the webhooks from its cache, and its leader's
binder decides from the same cache. Two live models (one per reader) decoded
every event twice and rebuilt twice; one, kept for the cache's life, costs each
event once, and both readers decide on the same facts. kube-scheduler's cache
is the model: one cache of node infos, the scheduler's *assumed* pods beside
it.

Contract:

- The model follows the cache's events for the cache's life, from its
  construction (every replica's webhooks read it; the binder reads it in its
  term).
- The binder's own device writes are an overlay (``Assumed``): read back, by
  the model and by the binder's preconditions, until the cache shows them or
  something newer (R-BIND-2). The webhooks see them too — each is a write the
  API server took. A term's end drops the overlay, and the model reads those
  devices from the store again (``forget_assumed``).
- Every read is :meth:`ReadModel.snapshot`, one at a time (a lock): a rebuild
  runs in slices with the event loop let go between them, and a caller that
  comes meanwhile waits for it rather than reading a half-built model or
  starting another. ``max_age`` lets a caller take the last snapshot while
  nothing was noted and it is that young (the webhooks: report freshness and
  launcher windows depend on ``now``).
- A kind a snapshot needs that is not synced raises ``NotSynced``; a
  required kind not served raises ``KindNotServed`` (KubeVirt's kinds are
  optional: not served reads as none). Callers say what that means to them.
- The safety net (:meth:`verify`) compares the live model with a build from
  the stores taken in the same step of the loop; only that step holds the
  lock, so the webhooks never wait behind the comparison.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from cozygpu import keys
from cozygpu.api import meta
from cozygpu.base.clock import Clock, LoopClock
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import KindNotServed
from cozygpu.cache.informer import resource_version_at_least
from cozygpu.cache.store import Store
from cozygpu.kube.client import Obj
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE, DEFAULT_REPORT_STALE_AFTER
from cozygpu.model.snapshot import DeviceKey, Snapshot
from cozygpu.views import specs
from cozygpu.views.build import DEFAULT_SLICE, InvalidHandler
from cozygpu.views.live import LiveSnapshot, Source


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
        return [found for obj in listed if (found := self.get(*meta.key(obj))) is not None]


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
        return iter([meta.key(o) for o in self._store.list()])

    def __len__(self) -> int:
        return len(self._store)


class ReadModel:
    """One live snapshot of ``cache`` and the binder's writes over it (see the module docstring)."""

    def __init__(self, cache: Cache, *, hoster_names: Sequence[str] = (),
                 report_stale_after: timedelta = DEFAULT_REPORT_STALE_AFTER,
                 launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE, clock: Clock | None = None,
                 follow: bool = True) -> None:
        """``follow``: False for a model never read (a binder without GPU): no kind is added to the cache for
        it, and only its overlay of device writes is used."""
        self._cache = cache
        #: ``now`` for the model and the age of the snapshot kept (injected: a test moves time).
        self.clock: Clock = clock if clock is not None else LoopClock()
        self._rebuilt: list[Callable[[str], None]] = []
        self._invalid: list[InvalidHandler] = []
        self.live = LiveSnapshot(hoster_names=hoster_names, report_stale_after=report_stale_after,
                                 launcher_grace=launcher_grace, on_invalid=self._told_invalid,
                                 on_rebuild=self._told_rebuilt)
        #: The binder's own device writes, read back until the cache shows them.
        self.assumed = Assumed(lambda: cache.store(specs.GPU_DEVICES))
        #: One refresh at a time: a rebuild in slices must not be entered again, nor read half-built.
        self._refreshing = asyncio.Lock()
        self._kept: tuple[float, Snapshot] | None = None
        for kind, spec in specs.SNAPSHOT_SPECS.items() if follow else ():  # for the cache's life
            cache.add(spec).subscribe(self.live.handler(kind))

    # -- who is told ------------------------------------------------------------------------

    def on_rebuild(self, listener: Callable[[str], None]) -> None:
        """Tell ``listener`` why, each time the model is built again from the stores (a metric's label)."""
        self._rebuilt.append(listener)

    def on_invalid(self, listener: InvalidHandler) -> None:
        """Tell ``listener`` of each object left out of the model because it cannot be read."""
        self._invalid.append(listener)

    def _told_rebuilt(self, why: str) -> None:
        for listener in self._rebuilt:
            listener(why)

    def _told_invalid(self, kind: str, obj: Mapping[str, Any], problem: str) -> None:
        for listener in self._invalid:
            listener(kind, obj, problem)

    # -- reading ------------------------------------------------------------------------------

    def sources(self) -> dict[str, Source | None]:
        """Each snapshot kind's store, the devices with the binder's writes over them; None for an optional
        kind not served. Raises ``KindNotServed`` (a required kind) or ``NotSynced`` as ``Cache.store``."""
        sources: dict[str, Source | None] = {}
        for kind, spec in specs.SNAPSHOT_SPECS.items():
            try:
                store = self._cache.store(spec)
            except KindNotServed:
                if spec not in specs.OPTIONAL_SNAPSHOT_SPECS:
                    raise
                sources[kind] = None
                continue
            if spec == specs.GPU_DEVICES:
                sources[kind] = Source(store, self.assumed.objects, self.assumed.get)
            else:
                sources[kind] = Source(store, store.list, store.get)
        return sources

    async def snapshot(self, *, max_age: float = 0.0) -> Snapshot:
        """The model of the cache now (the last one while nothing was noted and it is under ``max_age`` s);
        a rebuild runs in slices, one at a time (a caller meanwhile waits for it)."""
        kept = self._kept
        if kept is not None and not self.live.dirty and self.clock.now() - kept[0] < max_age:
            return kept[1]
        async with self._refreshing:
            snapshot = await self.live.refreshed(now=self.clock.wall(), sources=self.sources())
            self._kept = (self.clock.now(), snapshot)
            return snapshot

    def devices(self) -> DevicesAsWritten:
        """The GPUDevice store by key with the binder's writes over it (what a pass's writes are decided on)."""
        return DevicesAsWritten(self._cache.store(specs.GPU_DEVICES), self.assumed)

    # -- the binder's writes ------------------------------------------------------------------

    def assume(self, answer: Obj) -> None:
        """A device the binder wrote (the object the server stored): read back until the cache shows it."""
        self.assumed.add(meta.key(answer), answer)
        self.live.changed(keys.GPUDEVICE_KIND, None, answer)

    def forget_assumed(self) -> None:
        """A term's end: the overlay dropped, and each device it held read from the store again."""
        written = self.assumed.pending()
        self.assumed.clear()
        for answer in written:
            self.live.changed(keys.GPUDEVICE_KIND, None, answer)  # a device's key is all a change notes

    # -- the safety net -----------------------------------------------------------------------

    async def verify(self, *, budget: float = DEFAULT_SLICE) -> str | None:
        """The live model against a build from the stores (``LiveSnapshot.verify``): the first difference, or
        None. The live snapshot and the stores' objects are taken under the lock, in one step of the loop;
        the build and the comparison run after, in slices, while webhooks read the model."""
        async with self._refreshing:
            now = self.clock.wall()
            sources = self.sources()
            live = await self.live.refreshed(now=now, sources=sources, budget=budget)
            objects = {kind: list(source.objects()) if source is not None else [] for kind, source in sources.items()}
        return await self.live.verify(now=now, live=live, objects=objects, budget=budget)
