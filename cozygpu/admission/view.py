"""What the webhooks read: the model's Snapshot from this replica's warm shared cache (R-RUN-2).

Why: the webhooks answer on every replica from their own cache, never by
listing the API per request, and ask the same model functions as the binder
and the catalog. The snapshot is the process's one read model, the binder's too
(``ReadModel``), kept up to date from the cache's events: a device event re-derives only what that
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

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Final

from cozygpu.base.clock import Clock
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import KindNotServed, NotSynced
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE
from cozygpu.model.snapshot import Snapshot
from cozygpu.views import specs
from cozygpu.views.readmodel import ReadModel

#: Seconds a snapshot is reused while nothing changed.
MAX_AGE: Final = 1.0

OPTIONAL: Final = specs.OPTIONAL_SNAPSHOT_SPECS
REQUIRED: Final = tuple(spec for spec in specs.SNAPSHOT_SPECS.values() if spec not in OPTIONAL)


class NotReady(Exception):
    """A kind the webhook needs has not synced on this replica yet."""


class SnapshotSource:
    """What the webhooks read of the process's read model (``ReadModel``; one of their own when none is given)."""

    def __init__(self, cache: Cache, *, hoster_names: Sequence[str] = (),
                 launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE, clock: Clock | None = None,
                 on_rebuild: Callable[[str], None] | None = None, model: ReadModel | None = None) -> None:
        # The binder's grace: a launcher window keeps units off orders here exactly as long as there (R-MOD-7).
        self.model = model if model is not None else ReadModel(cache, hoster_names=hoster_names,
                                                               launcher_grace=launcher_grace, clock=clock)
        if on_rebuild is not None:
            self.model.on_rebuild(on_rebuild)

    async def snapshot(self) -> Snapshot:
        """The model of this replica's cache now (kept up to ``MAX_AGE`` while nothing changed); a rebuild (a
        first list, a class's new resource name) runs in slices, one at a time (webhook calls meanwhile wait
        for it). ``NotReady`` while a kind it needs is not synced, or a required one not served."""
        try:
            return await self.model.snapshot(max_age=MAX_AGE)
        except KindNotServed as error:
            raise NotReady(f"{error.kind} is not served") from None
        except NotSynced as error:
            raise NotReady(f"this replica's cache of {error.kind} has not synced yet; try again shortly") from None
