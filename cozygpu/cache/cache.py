"""The cache: a lazy map of informers, one per ``KindSpec``, started when their kind is served.

Structured concurrency: ``run()`` owns one ``asyncio.TaskGroup`` holding the
CRD informer (served-kind discovery), one supervisor task per built-in kind
and one reflector task per served kind. Cancelling ``run()`` cancels them all;
no task outlives it. ``running()`` wraps ``run()`` for a ``with`` block. The
cache is the only reader of watch streams.

Lazy: ``add(spec)`` registers an informer at any time; it starts as soon as
the cache runs and its kind is served. A kind whose CRD appears later joins
then, and one whose CRD goes is marked unserved (its store dropped) until the
CRD is back. ``store()`` of a spec that was never added adds it, and raises
``NotSynced`` until its first list is stored.

Readiness (R-RUN-2) is ``has_synced(*specs)`` over the kinds a component
reads without KubeVirt; it never depends on other kinds, so a KubeVirt that
is not installed cannot hold it back. Kinds that need a CRD are unknown (not
unserved) until the CRD informer's first list is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from cozygpu.base.backoff import Backoff
from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.logging import get_logger
from cozygpu.cache.errors import UnknownKind
from cozygpu.cache.frozen import FrozenDict
from cozygpu.cache.informer import Informer
from cozygpu.cache.kinds import CRDS, DiscoveryClient, KindSpec, SpecOrKey, crd_serves, discover
from cozygpu.cache.metrics import CacheMetrics, StateRow, default_metrics
from cozygpu.cache.reflector import ListWatchClient, Reflector, ReflectorSettings, Sink
from cozygpu.cache.store import Event, EventType, Store
from cozygpu.cache.triggers import Trigger
from cozygpu.kube import errors

log = get_logger("cozygpu.cache")


class CacheClient(ListWatchClient, DiscoveryClient, Protocol):
    """What the cache needs of ``cozygpu.kube.Client``: list, watch, and GET for discovery."""


class Cache:
    """Informers for every kind the process reads (see the module docstring)."""

    def __init__(
        self,
        client: CacheClient,
        *,
        registry: CollectorRegistry | None = None,
        clock: Clock | None = None,
        settings: ReflectorSettings | None = None,
        discovery_timeout: float = 10.0,
    ) -> None:
        self._client = client
        self._clock = clock or LoopClock()
        self._settings = settings or ReflectorSettings()
        self._metrics = default_metrics() if registry is None else CacheMetrics(registry)
        self._discovery_timeout = discovery_timeout
        self._informers: dict[str, Informer] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._group: asyncio.TaskGroup | None = None
        self._crds = Informer(CRDS)
        self._crds.subscribe(self._on_crd_event)
        self._crd_synced = False

    # -- registering kinds ----------------------------------------------------------------

    def add(self, spec: KindSpec) -> Informer:
        """The informer of ``spec``, registered (and started, when running and served) if new."""
        informer = self._informers.get(spec.key)
        if informer is not None:
            # Transforms and indexers are functions, compared by identity: a spec with
            # other indexes under the same key would hand its reader an informer without them.
            if (informer.spec != spec or informer.spec.transform is not spec.transform
                    or informer.spec.page_decoder is not spec.page_decoder
                    or dict(informer.spec.indexers) != dict(spec.indexers)):
                raise ValueError(f"{spec.key}: another spec is already registered under this key")
            return informer
        if spec.key == CRDS.key:
            raise ValueError(f"{spec.key}: the cache's own CRD informer key")
        informer = Informer(spec)
        self._informers[spec.key] = informer
        if self._group is not None:
            self._start(informer)
        return informer

    def informer(self, spec_or_key: SpecOrKey) -> Informer:
        """The informer of a spec (added if new) or of a key (``UnknownKind`` if never added)."""
        if isinstance(spec_or_key, KindSpec):
            return self.add(spec_or_key)
        if spec_or_key == CRDS.key:
            return self._crds
        try:
            return self._informers[spec_or_key]
        except KeyError:
            raise UnknownKind(spec_or_key) from None

    @property
    def informers(self) -> list[Informer]:
        return list(self._informers.values())

    @property
    def crds(self) -> Informer:
        """The cache's own informer of CustomResourceDefinitions (slimmed, no schemas)."""
        return self._crds

    # -- reading --------------------------------------------------------------------------

    def store(self, spec_or_key: SpecOrKey) -> Store:
        """The kind's store; raises ``KindNotServed``, ``NotSynced`` or ``UnknownKind`` instead."""
        return self.informer(spec_or_key).store

    def is_served(self, spec_or_key: SpecOrKey) -> bool:
        """Whether the kind is served now (False while not known yet)."""
        return self.informer(spec_or_key).served is True

    def has_synced(self, *specs: SpecOrKey) -> bool:
        """Whether every named kind is served and has stored its first list."""
        return all(self.informer(spec).has_synced for spec in specs)

    async def wait_synced(self, *specs: SpecOrKey, timeout: float | None = None) -> None:
        """Wait until every named kind has synced (an unserved kind: until it is served and synced)."""
        informers = [self.informer(spec) for spec in specs]
        async with asyncio.timeout(timeout):
            for informer in informers:
                await informer.wait_synced()

    async def wait_for_resource_version(self, spec_or_key: SpecOrKey, resource_version: str,
                                        timeout: float | None = None) -> Store:
        """Wait until the kind's store has seen ``resource_version`` (R-BIND-2) and return it."""
        return await self.informer(spec_or_key).wait_for_resource_version(resource_version, timeout)

    def trigger(self, *specs: SpecOrKey, name: str = "",
                when: Mapping[str, Callable[[Event], bool]] | None = None) -> Trigger:
        """A coalescing trigger fired by every change, sync and served transition of the named kinds.

        ``when`` maps a kind's key to a predicate: that kind's changes fire it only when one passes.
        """
        informers = [self.informer(spec) for spec in specs]
        trigger = Trigger(name or ",".join(i.key for i in informers))
        for informer in informers:
            informer.add_trigger(trigger, when=(when or {}).get(informer.key))
        return trigger

    # -- running --------------------------------------------------------------------------

    async def run(self) -> None:
        """Run every informer until cancelled."""
        if self._group is not None:
            raise RuntimeError("the cache is already running")
        self._metrics.states.add(self._states)
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                feed = _CrdFeed(self._crds.begin_cycle(), self._on_crds_listed)
                group.create_task(self._reflect(self._crds, feed), name=f"cache {CRDS.key}")
                for informer in list(self._informers.values()):
                    self._start(informer)
                await asyncio.Future()  # until cancelled
        finally:
            self._group = None
            self._tasks.clear()
            self._crd_synced = False
            self._crds.end_cycle(None)
            for informer in self._informers.values():
                informer.end_cycle(None)
            self._metrics.states.remove(self._states)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Cache]:
        """Run the cache for the duration of the block; leaving the block stops every informer.

        If the cache itself fails (a bug: informers retry every API error), the
        block is cancelled and the failure is raised from the ``async with``.
        """
        task = asyncio.create_task(self.run(), name="cache")
        host = asyncio.current_task()

        def on_done(done: asyncio.Task[None]) -> None:
            if not done.cancelled() and done.exception() is not None and host is not None:
                host.cancel()

        task.add_done_callback(on_done)
        try:
            yield self
        finally:
            task.remove_done_callback(on_done)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- internals ------------------------------------------------------------------------

    def _start(self, informer: Informer) -> None:
        assert self._group is not None
        if informer.spec.needs_crd:
            if self._crd_synced:
                self._reconcile(informer)
        else:
            self._tasks[informer.key] = self._group.create_task(
                self._supervise_built_in(informer), name=f"cache {informer.key}"
            )

    async def _reflect(self, informer: Informer, feed: Sink) -> None:
        reflector = Reflector(self._client, informer.spec, feed,
                              clock=self._clock, metrics=self._metrics, settings=self._settings)
        await reflector.run()

    async def _supervise_built_in(self, informer: Informer) -> None:
        """Check discovery until the kind is served, then reflect it for good."""
        backoff = Backoff(self._clock, initial=1.0, cap=60.0, reset_after=float("inf"))
        while True:
            try:
                reason = await discover(self._client, informer.spec, timeout=self._discovery_timeout)
            except errors.KubeError as err:
                log.warning("discovery failed", kind=informer.key, error=str(err))
                await backoff.wait()
                continue
            except Exception:
                log.exception("discovery failed", kind=informer.key)
                await backoff.wait()
                continue
            if reason is None:
                break
            if informer.served is not False:
                log.warning("kind not served", kind=informer.key, reason=reason)
                informer.end_cycle(reason)
            await backoff.wait()
        await self._reflect(informer, informer.begin_cycle())

    def _on_crd_event(self, event: Event) -> None:
        if not self._crd_synced:
            return
        name = event.obj.get("metadata", {}).get("name")
        for informer in self._informers.values():
            if informer.spec.needs_crd and informer.spec.crd_name == name:
                self._reconcile(informer)

    def _on_crds_listed(self) -> None:
        self._crd_synced = True
        for informer in self._informers.values():
            if informer.spec.needs_crd:
                self._reconcile(informer)

    def _reconcile(self, informer: Informer) -> None:
        """Start or stop a CRD-backed informer to match what its CRD says now."""
        if self._group is None or not self._crd_synced:
            return
        crd = self._crds.store.get(None, informer.spec.crd_name)
        reason = crd_serves(crd, informer.spec)
        task = self._tasks.get(informer.key)
        if reason is None:
            if task is None:
                log.info("kind served; starting its informer", kind=informer.key)
                feed = informer.begin_cycle()
                self._tasks[informer.key] = self._group.create_task(
                    self._reflect(informer, feed), name=f"cache {informer.key}"
                )
        else:
            if task is not None:
                log.info("kind no longer served; stopping its informer", kind=informer.key, reason=reason)
                task.cancel()
                del self._tasks[informer.key]
            if informer.served is not False or informer.unserved_reason != reason:
                informer.end_cycle(reason)

    def _states(self) -> Iterable[StateRow]:
        for informer in [self._crds, *self._informers.values()]:
            yield informer.key, len(informer), informer.has_synced, informer.served


class _CrdFeed:
    """The CRD informer's sink: after every (re)list, served state is decided for every CRD-backed kind."""

    def __init__(self, feed: Sink, on_listed: Any) -> None:
        self._feed = feed
        self._on_listed = on_listed

    def prepare(self, raw: dict[str, Any]) -> FrozenDict:
        return self._feed.prepare(raw)

    def adopt(self, obj: FrozenDict) -> FrozenDict:
        return self._feed.adopt(obj)

    def replace(self, objects: list[FrozenDict], resource_version: str) -> None:
        self._feed.replace(objects, resource_version)
        self._on_listed()

    def apply(self, type: EventType, obj: FrozenDict) -> None:
        self._feed.apply(type, obj)

    def advance(self, resource_version: str) -> None:
        self._feed.advance(resource_version)
