"""One kind's informer: a store, its served and synced state, and the fan-out of its changes.

States of an informer, per serve cycle:

    unknown ──served──▶ served, not synced ──first list──▶ served, synced
       ▲  │                     │                                │
       │  └──unserved──▶ unserved ◀──────────kind goes───────────┘
       └─────────────cache stops (from any state)

- Reading (``store``) succeeds only when served and synced; otherwise it raises
  ``NotSynced`` (unknown, or served but not listed yet) or ``KindNotServed``.
  Never an empty store in place of an unknown one.
- Each time the kind becomes served, the informer starts from a new, empty
  store; when it stops being served, the store is dropped without DELETED
  events (an unserved kind is a gap in what we can see, not an absence,
  R-BIND-7); its triggers fire so waiting loops notice.
- Handlers (``subscribe``) are called synchronously, in the informer's task, in
  the order the store changed, after the store changed (a handler that reads
  the store sees the new state). They must not block or await; exceptions are
  logged and swallowed. A relist delivers the differences to the stored state
  as ADDED, MODIFIED and DELETED events after replacing the store at once.
- Triggers (``add_trigger``) fire on every change, on the first sync and on
  every served/unserved transition; they coalesce (``triggers.py``). A
  trigger added ``when=`` a predicate fires for a batch of changes only if
  one of them passes it (its lifecycle fires stay unconditional): a loop that
  cares about a few fields of a chatty kind is not woken by the rest.
- ``wait_for_resource_version(rv)`` returns once the store has seen ``rv``:
  the informer's last resourceVersion (from the list, an event or a bookmark)
  is at least ``rv``. That is how a writer proves the cache has seen its own
  write (R-BIND-2). Pass the resourceVersion of a write **to this kind**: the
  informer hears of other kinds' revisions only through bookmarks, about once
  a minute. resourceVersions are compared as integers, as kube-scheduler's
  assume cache does; if either is not an integer only equality counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from cozygpu.base.logging import get_logger
from cozygpu.cache.errors import KindNotServed, NotSynced
from cozygpu.cache.frozen import FrozenDict, freeze
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.store import Event, EventType, Store, resource_version_of
from cozygpu.cache.transforms import strip_metadata
from cozygpu.cache.triggers import Trigger

log = get_logger("cozygpu.cache")

Handler = Callable[[Event], None]
Obj = dict[str, Any]


def resource_version_at_least(have: str, want: str) -> bool:
    """Whether ``have`` is ``want`` or later (integers compared as such; otherwise only equality)."""
    if have == want:
        return True
    try:
        return int(have) >= int(want)
    except ValueError:
        return False


class Informer:
    """One kind's cache (see the module docstring). Created by ``Cache.add``."""

    def __init__(self, spec: KindSpec) -> None:
        self.spec = spec
        self.key = spec.key
        self._indexers = spec.all_indexers()
        self._served: bool | None = None
        self._unserved_reason = ""
        self._feed: _Feed | None = None
        self._handlers: list[Handler] = []
        self._triggers: list[tuple[Trigger, Callable[[Event], bool] | None]] = []
        self._wakeup: asyncio.Event | None = None

    # -- reading --------------------------------------------------------------------------

    @property
    def served(self) -> bool | None:
        """True when served, False when the API server does not serve the kind, None while unknown."""
        return self._served

    @property
    def unserved_reason(self) -> str:
        return self._unserved_reason

    @property
    def has_synced(self) -> bool:
        return self._feed is not None and self._feed.synced

    @property
    def store(self) -> Store:
        """The store; raises ``KindNotServed`` or ``NotSynced`` instead of an incomplete one."""
        feed = self._feed
        if feed is not None and feed.synced:
            return feed.store
        if self._served is False:
            raise KindNotServed(self.key, self._unserved_reason)
        if self._served is None:
            raise NotSynced(self.key, "discovery has not said whether the kind is served yet")
        raise NotSynced(self.key)

    @property
    def resource_version(self) -> str:
        """The last resourceVersion seen in this serve cycle ("" before the first list)."""
        return self._feed.store.resource_version if self._feed is not None else ""

    def __len__(self) -> int:
        return len(self._feed.store) if self._feed is not None else 0

    # -- waiting --------------------------------------------------------------------------

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until served and listed; an unserved kind waits until it is served and listed."""
        async with asyncio.timeout(timeout):
            while not self.has_synced:
                await self._changed()

    async def wait_for_resource_version(self, resource_version: str, timeout: float | None = None) -> Store:
        """Wait until the store has seen ``resource_version`` (of a write to this kind) and return it (R-BIND-2).

        Raises ``KindNotServed`` if the kind is (or becomes) unserved, ``TimeoutError`` on timeout.
        """
        async with asyncio.timeout(timeout):
            while True:
                if self._served is False:
                    raise KindNotServed(self.key, self._unserved_reason)
                feed = self._feed
                if feed is not None and feed.synced and resource_version_at_least(
                        feed.store.resource_version, resource_version):
                    return feed.store
                await self._changed()

    def _changed(self) -> Any:
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        return self._wakeup.wait()

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            wakeup.set()

    # -- fan-out --------------------------------------------------------------------------

    @property
    def handler_count(self) -> int:
        """How many handlers follow this kind now (a follower's binder subscribes none)."""
        return len(self._handlers)

    def subscribe(self, handler: Handler) -> Callable[[], None]:
        """Call ``handler`` with every change from now on; returns the unsubscribe function."""
        self._handlers.append(handler)

        def unsubscribe() -> None:
            if handler in self._handlers:
                self._handlers.remove(handler)

        return unsubscribe

    def add_trigger(self, trigger: Trigger, *, when: Callable[[Event], bool] | None = None) -> None:
        """Fire ``trigger`` on changes (only those ``when`` passes, if given), syncs and served changes."""
        if all(t is not trigger for t, _ in self._triggers):
            self._triggers.append((trigger, when))

    def remove_trigger(self, trigger: Trigger) -> None:
        self._triggers = [(t, when) for t, when in self._triggers if t is not trigger]

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            for handler in list(self._handlers):
                try:
                    handler(event)
                except Exception:
                    log.exception("event handler failed", kind=self.key, handler=repr(handler), event=event.type,
                                  name=event.obj.get("metadata", {}).get("name"))
        if events:
            for trigger, when in list(self._triggers):
                if when is None or any(when(event) for event in events):
                    trigger.fire(self.key)

    def _fire(self) -> None:
        for trigger, _ in self._triggers:
            trigger.fire(self.key)

    # -- lifecycle (driven by the cache) --------------------------------------------------

    def begin_cycle(self) -> _Feed:
        """The kind is served: start over from an empty store; returns the reflector's sink."""
        self._feed = _Feed(self, Store(self.key, self._indexers))
        self._served = True
        self._unserved_reason = ""
        self._wake()
        self._fire()
        return self._feed

    def end_cycle(self, unserved_reason: str | None) -> None:
        """The kind stopped being served (with a reason) or the cache stopped (None): drop the store."""
        self._feed = None
        self._served = None if unserved_reason is None else False
        self._unserved_reason = unserved_reason or ""
        self._wake()
        self._fire()

    def is_current(self, feed: _Feed) -> bool:
        return self._feed is feed


class _Feed:
    """The reflector's side of one serve cycle (the ``reflector.Sink``)."""

    def __init__(self, informer: Informer, store: Store) -> None:
        self._informer = informer
        self.store = store
        self.synced = False
        spec = informer.spec
        self._transform = spec.transform
        self._api_version = spec.api_version
        self._kind = spec.kind

    def prepare(self, raw: Obj) -> FrozenDict:
        meta = raw.get("metadata") or {}
        stored = self.store.get_by_key((meta.get("namespace") or "", meta.get("name", "")))
        if stored is not None:
            rv = meta.get("resourceVersion")
            if rv and resource_version_of(stored) == rv:
                return stored  # unchanged since stored: skip transform and freeze
        obj = strip_metadata(raw)
        if self._transform is not None:
            obj = self._transform(obj)
        obj["apiVersion"] = self._api_version
        obj["kind"] = self._kind
        frozen: FrozenDict = freeze(obj)
        return frozen

    def adopt(self, obj: FrozenDict) -> FrozenDict:
        meta = obj.get("metadata") or {}
        stored = self.store.get_by_key((meta.get("namespace") or "", meta.get("name", "")))
        if stored is not None:
            rv = meta.get("resourceVersion")
            if rv and resource_version_of(stored) == rv:
                return stored  # unchanged since stored: keep the one readers already share
        return FrozenDict({**obj, "apiVersion": self._api_version, "kind": self._kind})

    def replace(self, objects: list[FrozenDict], resource_version: str) -> None:
        informer = self._informer
        if not informer.is_current(self):
            return
        events = self.store.replace(objects, resource_version)
        first = not self.synced
        self.synced = True
        informer._wake()
        informer._dispatch(events)
        if first and not events:
            informer._fire()

    def apply(self, type: EventType, obj: FrozenDict) -> None:
        informer = self._informer
        if not informer.is_current(self):
            return
        store = self.store
        event = store.delete(obj) if type == "DELETED" else store.upsert(obj)
        rv = resource_version_of(obj)
        if rv:
            store.resource_version = rv
        informer._wake()
        if event is not None:
            informer._dispatch([event])

    def advance(self, resource_version: str) -> None:
        if not self._informer.is_current(self):
            return
        self.store.resource_version = resource_version
        self._informer._wake()
