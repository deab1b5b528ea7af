"""The reflector: list, then watch from the list's resourceVersion, and relist when that is no longer possible.

One reflector feeds one informer (its ``Sink``) and is the only reader of that
kind's watch streams. Its loop, per kind:

1. **List** the collection in pages (``limit``/``continue``) with no
   resourceVersion, which is a consistent read, and hand the whole result to
   the sink at once (``replace``), so a relist can neither lose nor invent an
   object. A streaming list (``sendInitialEvents``) is not used: 1.33 refuses
   it by default, and where it is served it cost the API server more CPU than
   pages of 500 (docs/cache.md, "Plain LIST, then WATCH").
2. **Watch** from the list's resourceVersion with bookmarks and a random
   server-side ``timeoutSeconds`` (5–10 min, so watches of many kinds do not
   all restart together). Every event and bookmark advances the
   resourceVersion; bookmarks never reach handlers.
3. When the server **ends a watch** normally, watch again from the last
   resourceVersion at once. When the stream is **silent** for longer than the
   inactivity timeout (bookmarks arrive about every minute), drop it and watch
   again. When the **connection fails**, back off and watch again from the last
   resourceVersion. When the server answers **410 Gone** (the resourceVersion
   or a list's continue token expired), relist.
4. Failures back off exponentially with jitter (``timing.Backoff``); a 410
   backs off on its own, shorter schedule, so one expiry costs a tenth of a
   second but a loop of them cannot spin.

The loop never returns and swallows every error except cancellation: one
kind's trouble must not stop the other informers. Errors are logged and
counted (``metrics.py``).

A kind whose spec has a ``page_decoder`` (pods) has its pages fetched as bytes
and decoded straight into transformed, frozen objects (``decoders.py``); the
others are decoded whole and go through the sink's ``prepare``.

List pages are decoded and frozen with the cyclic garbage collector paused
(``collector.collector_paused``): decoding 20,000 pods with it running costs several times the
decoding itself, because each page's short-lived objects survive long enough
to trigger full collections over the whole cache. Nothing is lost: collection
resumes when no list is in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Protocol

import attrs

from cozygpu.base.backoff import Backoff, Random, new_random, spread
from cozygpu.base.clock import Cancellable, Clock
from cozygpu.base.logging import get_logger
from cozygpu.cache.collector import collector_paused
from cozygpu.cache.frozen import FrozenDict
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.metrics import CacheMetrics
from cozygpu.cache.store import EventType, resource_version_of
from cozygpu.kube import errors

log = get_logger("cozygpu.cache")

#: Lists are asked for uncompressed: gzip of a 200 MB pod list costs the API server
#: seconds of CPU and us half a second to undo, to save bandwidth nobody lacks
#: between a controller and its API server.
_LIST_HEADERS: Final = {"Accept-Encoding": "identity"}
#: Seconds of buffered watch events folded before the event loop is let go (its other tasks wait no longer).
HOLD_AT_MOST: Final = 0.004

Obj = dict[str, Any]


class ListWatchClient(Protocol):
    """What the reflector needs of ``cozygpu.kube.Client``."""

    async def list_objects(self, path: str, *, params: Mapping[str, str | int | bool] | None = None,
                           **kw: Any) -> Obj: ...

    async def list_bytes(self, path: str, *, params: Mapping[str, str | int | bool] | None = None,
                         **kw: Any) -> bytes: ...

    def watch(self, path: str, *, params: Mapping[str, str | int | bool] | None = None, read_timeout: float = ...,
              connect_timeout: float = ...) -> AsyncIterator[Obj]: ...


class Sink(Protocol):
    """Where the reflector delivers what it reads (the informer)."""

    def prepare(self, raw: Obj) -> FrozenDict:
        """Transform and freeze one decoded object (or reuse the stored one if unchanged)."""
        ...

    def adopt(self, obj: FrozenDict) -> FrozenDict:
        """Take one object a page decoder already transformed and froze (or reuse the stored one if unchanged)."""
        ...

    def replace(self, objects: list[FrozenDict], resource_version: str) -> None: ...

    def apply(self, type: EventType, obj: FrozenDict) -> None: ...

    def advance(self, resource_version: str) -> None:
        """A bookmark: the kind is known up to ``resource_version``, with no change to report."""
        ...


@attrs.frozen
class ReflectorSettings:
    page_size: int = 500
    #: Per list page (each page is one request).
    list_timeout: float = 60.0
    #: A watch with no event and no bookmark for this long is dropped and started again.
    inactivity_timeout: float = 120.0
    #: Server-side ``timeoutSeconds`` is drawn from this range for each watch.
    watch_timeout: tuple[int, int] = (300, 600)
    connect_timeout: float = 10.0
    #: A watch the server ends sooner than this with no event counts as a failure (backs off).
    min_watch_duration: float = 1.0
    backoff_initial: float = 0.8
    backoff_cap: float = 30.0
    gone_backoff_initial: float = 0.1


class WatchInactive(Exception):
    """The watch stream said nothing for longer than the inactivity timeout."""


class _ShortWatch(Exception):
    """The server ended a watch at once without an event."""


class _Watchdog:
    """Calls ``expire`` once the stream has been silent for ``seconds`` (O(1) per event)."""

    def __init__(self, clock: Clock, seconds: float, expire: Any) -> None:
        self._clock = clock
        self._seconds = seconds
        self._expire = expire
        self.last = clock.now()
        self._handle: Cancellable = clock.call_later(seconds, self._check)

    def kick(self) -> None:
        self.last = self._clock.now()

    def _check(self) -> None:
        idle = self._clock.now() - self.last
        if idle >= self._seconds:
            self._expire()
        else:
            self._handle = self._clock.call_later(self._seconds - idle, self._check)

    def cancel(self) -> None:
        self._handle.cancel()


class Reflector:
    """Keeps one sink in step with one kind on the API server (see the module docstring)."""

    def __init__(
        self,
        client: ListWatchClient,
        spec: KindSpec,
        sink: Sink,
        *,
        clock: Clock,
        metrics: CacheMetrics,
        settings: ReflectorSettings | None = None,
        rng: Random | None = None,
    ) -> None:
        self._client = client
        self._spec = spec
        self._sink = sink
        self._clock = clock
        self._settings = settings or ReflectorSettings()
        self._rng = rng if rng is not None else new_random()
        s = self._settings
        self._backoff = Backoff(clock, initial=s.backoff_initial, cap=s.backoff_cap, rng=self._rng.random)
        self._gone_backoff = Backoff(clock, initial=s.gone_backoff_initial, cap=s.backoff_cap, rng=self._rng.random)
        kind = spec.key
        self._kind = kind
        self._events = {t: metrics.events.labels(kind, t) for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")}
        self._restarts = metrics.watch_restarts
        self._relists = metrics.relists
        self._list_seconds = metrics.list_seconds.labels(kind)
        #: The resourceVersion to watch from; None means the next step is a list.
        self.resource_version: str | None = None

    async def run(self) -> None:
        """List and watch until cancelled."""
        relist_reason = "initial"
        while True:
            try:
                if self.resource_version is None:
                    await self._list(relist_reason)
                await self._watch()
                self._restarts.labels(self._kind, "closed").inc()
            except asyncio.CancelledError:
                raise
            except WatchInactive:
                log.info("watch silent, watching again", kind=self._kind, seconds=self._settings.inactivity_timeout)
                self._restarts.labels(self._kind, "inactive").inc()
            except errors.Gone as err:
                log.info("watch expired; relisting", kind=self._kind, error=err.message)
                if self.resource_version is not None:
                    self._restarts.labels(self._kind, "expired").inc()
                self.resource_version = None
                relist_reason = "expired"
                await self._gone_backoff.wait()
            except Exception as err:
                if self.resource_version is not None:
                    self._restarts.labels(self._kind, "error").inc()
                delay = self._backoff.next_delay()
                if isinstance(err, errors.KubeError | _ShortWatch):
                    log.warning("watch failed; retrying", kind=self._kind, error=str(err), delay=round(delay, 1))
                else:
                    log.exception("unexpected error; retrying", kind=self._kind, delay=round(delay, 1))
                await self._clock.sleep(delay)

    async def _list(self, reason: str) -> None:
        spec, settings = self._spec, self._settings
        started = self._clock.now()
        objects: list[FrozenDict] = []
        params: dict[str, str | int | bool] = {**spec.selector_params(), "limit": settings.page_size}
        resource_version = ""
        decoder = spec.page_decoder
        while True:
            with collector_paused():
                if decoder is None:
                    page = await self._client.list_objects(spec.path, params=params, timeout=settings.list_timeout,
                                                           headers=_LIST_HEADERS)
                    prepare = self._sink.prepare
                    objects.extend(prepare(raw) for raw in page.get("items") or ())
                    meta = page.get("metadata") or {}
                    del page
                    page_version, token = str(meta.get("resourceVersion") or ""), str(meta.get("continue") or "")
                else:
                    body = await self._client.list_bytes(spec.path, params=params, timeout=settings.list_timeout,
                                                         headers=_LIST_HEADERS)
                    try:
                        decoded = decoder(body)
                    except ValueError as err:
                        raise errors.Unavailable(f"LIST {spec.path}: {err}") from err
                    del body
                    adopt = self._sink.adopt
                    objects.extend(adopt(obj) for obj in decoded.items)
                    page_version, token = decoded.resource_version, decoded.continue_token
                    del decoded
            resource_version = page_version or resource_version
            if not token:
                break
            params["continue"] = token
        if not resource_version:
            raise errors.KubeError(f"LIST {spec.path}: the answer carries no resourceVersion")
        self._sink.replace(objects, resource_version)
        self.resource_version = resource_version
        self._relists.labels(self._kind, reason).inc()
        self._list_seconds.observe(self._clock.now() - started)
        log.debug("listed", kind=self._kind, objects=len(objects), resource_version=resource_version)

    async def _watch(self) -> None:
        spec, settings = self._spec, self._settings
        assert self.resource_version is not None
        low, high = settings.watch_timeout
        params: dict[str, str | int | bool] = {
            **spec.selector_params(),
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": spread(low, high, self._rng),
        }
        started = self._clock.now()
        received = 0
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(None) as scope:
                dog = _Watchdog(self._clock, settings.inactivity_timeout, lambda: scope.reschedule(loop.time()))
                try:
                    stream = self._client.watch(
                        spec.path, params=params,
                        read_timeout=settings.inactivity_timeout + 30.0, connect_timeout=settings.connect_timeout,
                    )
                    try:
                        held_since = self._clock.now()
                        async for event in stream:
                            dog.kick()
                            received += 1
                            self._deliver(event)
                            # Events already buffered come without a suspension: let the loop go now and then,
                            # so a burst of thousands (a fleet growing) does not hold every other task.
                            if self._clock.now() - held_since >= HOLD_AT_MOST:
                                await asyncio.sleep(0)
                                held_since = self._clock.now()
                    finally:
                        aclose = getattr(stream, "aclose", None)
                        if aclose is not None:
                            await aclose()  # release the connection now, not when the generator is collected
                finally:
                    dog.cancel()
        except TimeoutError:
            if scope.expired():
                raise WatchInactive() from None
            raise
        if received == 0 and self._clock.now() - started < settings.min_watch_duration:
            raise _ShortWatch(f"WATCH {spec.path}: the server ended the watch at once")

    def _deliver(self, event: Obj) -> None:
        kind = event.get("type")
        raw = event.get("object") or {}
        if kind == "BOOKMARK":
            rv = resource_version_of(raw)
            if rv:
                self.resource_version = rv
                self._sink.advance(rv)
            self._events["BOOKMARK"].inc()
        elif kind == "ADDED" or kind == "MODIFIED" or kind == "DELETED":
            obj = self._sink.prepare(raw)
            self._sink.apply(kind, obj)
            self.resource_version = resource_version_of(obj) or self.resource_version
            self._events[kind].inc()
        else:
            log.warning("ignoring a watch event of an unknown type", kind=self._kind, type=kind)
