"""What the webhooks read: the model's Snapshot from this replica's warm shared cache (R-RUN-2).

Why: the webhooks answer on every replica from their own cache, never by
listing the API per request, and ask the same model functions as the binder
and the catalog. Building a snapshot is O(objects), so one is kept while no
informer the snapshot reads has moved (the resourceVersions of their stores)
and it is less than ``MAX_AGE`` seconds old (report freshness depends on
``now``); unchanged objects are converted once (``ViewMemo``).

A kind that is not synced yet is an error (``NotReady``), never an empty
list: the webhook refuses rather than decide on a partial view. KubeVirt's
kinds are optional: not served reads as none (no VMI can then be admitted
anyway), served but not synced is ``NotReady``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from cozygpu.base.clock import utc_now
from cozygpu.base.logging import get_logger
from cozygpu.cache import specs
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import KindNotServed, NotSynced
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.snapshot import ViewMemo, build_snapshot
from cozygpu.model.snapshot import Snapshot

_log = get_logger("cozygpu.admission")

#: Seconds a snapshot is reused while nothing changed.
MAX_AGE: Final = 1.0

REQUIRED: Final = (specs.GPU_CLASSES, specs.GPU_DEVICES, specs.GPU_NODES, specs.NODES, specs.PODS,
                   specs.TENANT_QUOTAS, specs.NAMESPACES)
OPTIONAL: Final = (specs.VMIS, specs.KUBEVIRTS)


class NotReady(Exception):
    """A kind the webhook needs has not synced on this replica yet."""


class SnapshotSource:
    """Snapshots of one cache, rebuilt only when something changed."""

    def __init__(self, cache: Cache, *, hoster_names: Sequence[str] = ()) -> None:
        self._cache = cache
        self._hoster = tuple(hoster_names)
        self._memo = ViewMemo()
        self._kept: tuple[tuple[str, ...], float, Snapshot] | None = None
        for spec in (*REQUIRED, *OPTIONAL):
            cache.add(spec)

    def _list(self, spec: KindSpec, *, optional: bool = False) -> Sequence[Any]:
        try:
            return self._cache.store(spec).list()
        except KindNotServed:
            if optional:
                return ()
            raise NotReady(f"{spec.key} is not served") from None
        except NotSynced:
            raise NotReady(f"this replica's cache of {spec.key} has not synced yet; try again shortly") from None

    def _versions(self) -> tuple[str, ...]:
        return tuple(self._cache.informer(spec).resource_version for spec in (*REQUIRED, *OPTIONAL))

    def snapshot(self) -> Snapshot:
        versions = self._versions()
        kept = self._kept
        if kept is not None and kept[0] == versions and time.monotonic() - kept[1] < MAX_AGE:
            return kept[2]
        snapshot = build_snapshot(
            now=utc_now(),
            classes=self._list(specs.GPU_CLASSES),
            devices=self._list(specs.GPU_DEVICES),
            gpunodes=self._list(specs.GPU_NODES),
            nodes=self._list(specs.NODES),
            pods=self._list(specs.PODS),
            vmis=self._list(specs.VMIS, optional=True),
            quotas=self._list(specs.TENANT_QUOTAS),
            namespaces=self._list(specs.NAMESPACES),
            kubevirts=self._list(specs.KUBEVIRTS, optional=True),
            hoster_names=self._hoster,
            memo=self._memo,
        )
        self._kept = (versions, time.monotonic(), snapshot)
        return snapshot
