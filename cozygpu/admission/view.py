"""What the webhooks read: the model's Snapshot from this replica's warm shared cache (R-RUN-2).

Why: the webhooks answer on every replica from their own cache, never by
listing the API per request, and ask the same model functions as the binder
and the catalog. The snapshot is kept up to date from the cache's events as
the binder's is (``LiveSnapshot``): a device event re-derives only what that
device touches, a Node heartbeat (the kubelet's, kwok's) changes nothing,
and the few changes an update cannot take (a class's new resource name, a
namespace, KubeVirt; docs/read-model.md) take every view again, through
the memo. On a fleet of a thousand
heartbeating Nodes, rebuilding whenever an informer moved made most calls
pay for every node. While nothing was noted, the last snapshot is reused for
up to ``MAX_AGE`` seconds (report freshness depends on ``now``). A rebuild
(a first list, a class's new resource name) runs in slices with the event
loop let go between them (``LiveSnapshot.refreshed``), one at a time per replica: a
webhook call that comes meanwhile waits for it instead of starting another.

A kind that is not synced yet is an error (``NotReady``), never an empty
list: the webhook refuses rather than decide on a partial view. KubeVirt's
kinds are optional: not served reads as none (no VMI can then be admitted
anyway), served but not synced is ``NotReady``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Final

from cozygpu.base.clock import Clock, LoopClock
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import KindNotServed, NotSynced
from cozygpu.cache.kinds import KindSpec
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE
from cozygpu.model.snapshot import Snapshot
from cozygpu.views import specs
from cozygpu.views.live import LiveSnapshot, Source

#: Seconds a snapshot is reused while nothing changed.
MAX_AGE: Final = 1.0

OPTIONAL: Final = specs.OPTIONAL_SNAPSHOT_SPECS
REQUIRED: Final = tuple(spec for spec in specs.SNAPSHOT_SPECS.values() if spec not in OPTIONAL)


class NotReady(Exception):
    """A kind the webhook needs has not synced on this replica yet."""


class SnapshotSource:
    """The snapshot of one cache, kept up to date from its events."""

    def __init__(self, cache: Cache, *, hoster_names: Sequence[str] = (),
                 launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE, clock: Clock | None = None,
                 on_rebuild: Callable[[str], None] | None = None) -> None:
        self._cache = cache
        #: Report freshness and the kept snapshot's age are read on it (injected: a test moves time).
        self._clock: Clock = clock if clock is not None else LoopClock()
        # The binder's grace: a launcher window keeps units off orders here exactly as long as there (R-MOD-7).
        self._live = LiveSnapshot(hoster_names=hoster_names, launcher_grace=launcher_grace, on_rebuild=on_rebuild)
        #: The kept snapshot and when it was taken.
        self._kept: tuple[float, Snapshot] | None = None
        #: One refresh at a time: a rebuild in slices must not be entered again from another webhook call.
        self._refreshing = asyncio.Lock()
        for kind, spec in specs.SNAPSHOT_SPECS.items():  # for the cache's life, as the webhooks are
            cache.add(spec).subscribe(self._live.handler(kind))

    def _source(self, spec: KindSpec) -> Source | None:
        try:
            store = self._cache.store(spec)
        except KindNotServed:
            if spec in OPTIONAL:
                return None
            raise NotReady(f"{spec.key} is not served") from None
        except NotSynced:
            raise NotReady(f"this replica's cache of {spec.key} has not synced yet; try again shortly") from None
        return Source(store, store.list, store.get)

    async def snapshot(self) -> Snapshot:
        """The model of this replica's cache now; a rebuild (a first list, a class's new resource name) runs in slices
        with the event loop let go between them, one at a time (webhook calls meanwhile wait for it)."""
        kept = self._kept
        if kept is not None and not self._live.dirty and self._clock.now() - kept[0] < MAX_AGE:
            return kept[1]
        async with self._refreshing:
            sources = {kind: self._source(spec) for kind, spec in specs.SNAPSHOT_SPECS.items()}
            snapshot = await self._live.refreshed(now=self._clock.wall(), sources=sources)
            self._kept = (self._clock.now(), snapshot)
            return snapshot
