"""The settings ConfigMap publisher (R-BIND-10), leader-only work.

The admission policies (R-POL-1) and cozystack-api read ConfigMap
``cozygpu-settings`` in the controller namespace:

- ``resourceNames``: the effective GPU resource names (R-MOD-9) as a sorted
  JSON list: the hoster's ``--gpu-resource-names``, every GPUClass's
  ``spec.resourceName``, every GPUNode's ``status.resourceNames`` and the
  GPU entries of KubeVirt's ``permittedHostDevices``. Without
  ``--enable-gpu`` neither GPUNodes nor KubeVirt are watched, so the list
  holds the hoster's names and the classes' (no policy reads it then: the
  policies render only with GPU enabled).
- ``rawNames``: ``allow`` or ``forbid`` (``--raw-gpu-names``).
- ``gpuEnabled``: ``"true"`` or ``"false"``.

Contract:
- One pass computes the data from the cache, reads the ConfigMap from the API
  (never from the cache, so a pass never decides from a stale copy), and
  writes only when one of the three keys differs: a create (which fails if
  the object appeared meanwhile) or a replace carrying the resourceVersion
  just read. A Conflict or AlreadyExists reads again. Other keys, labels and
  annotations on the object (the chart's, say) are kept.
- Passes run when a GPUClass, GPUNode, KubeVirt CR or the ConfigMap itself
  changes (one coalescing trigger), and every ``resync`` seconds regardless.
- A kind that has not synced yet makes the pass wait (publishing a partial set
  would let raw names through); KubeVirt not being served means no table.
- A failed pass is retried with backoff; it never ends leader work.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol

from cozygpu import keys
from cozygpu.cache import specs
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import CacheError, KindNotServed
from cozygpu.cache.snapshot import InvalidObject, gpu_class_view, node_inventory, permitted_host_devices
from cozygpu.kube import errors
from cozygpu.kube.client import Obj, resource_path
from cozygpu.model.resource_names import effective_names
from cozygpu.model.snapshot import GPUClassView, NodeInventory
from cozygpu.runtime.logging import get_logger
from cozygpu.runtime.metrics import SettingsMetrics

_log = get_logger("cozygpu.settings")

#: Conflicts tolerated in one pass before it counts as failed and backs off.
_WRITE_ATTEMPTS: Final = 5


class ConfigMapClient(Protocol):
    async def get_or_none(self, path: str, **kw: Any) -> Obj | None: ...

    async def create(self, path: str, body: Obj, **kw: Any) -> Obj: ...

    async def replace(self, path: str, body: Obj, **kw: Any) -> Obj: ...


def settings_data(*, resource_names: Iterable[str], raw_names: str, gpu_enabled: bool) -> dict[str, str]:
    """The three keys as the policies read them."""
    return {
        keys.SETTINGS_RESOURCE_NAMES: json.dumps(sorted(set(resource_names)), separators=(",", ":")),
        keys.SETTINGS_RAW_NAMES: raw_names,
        keys.SETTINGS_GPU_ENABLED: "true" if gpu_enabled else "false",
    }


class SettingsPublisher:
    """Keeps the settings ConfigMap equal to what the cache says (see the module docstring)."""

    name = "settings-publisher"

    def __init__(
        self,
        client: ConfigMapClient,
        cache: Cache,
        *,
        namespace: str,
        hoster_names: Iterable[str],
        raw_names: str,
        gpu_enabled: bool,
        metrics: SettingsMetrics | None = None,
        resync: float = 300.0,
        max_backoff: float = 30.0,
    ) -> None:
        self._client = client
        self._cache = cache
        self._namespace = namespace
        self._hoster = tuple(hoster_names)
        self._raw_names = raw_names
        self._gpu = gpu_enabled
        self._metrics = metrics
        self._resync = resync
        self._max_backoff = max_backoff
        self._path = resource_path("", "v1", "configmaps", namespace=namespace, name=keys.SETTINGS_CONFIGMAP)
        self._collection = resource_path("", "v1", "configmaps", namespace=namespace)
        watched = [specs.GPU_CLASSES]
        if gpu_enabled:
            watched += [specs.GPU_NODES, specs.KUBEVIRTS, specs.settings_configmap(namespace)]
        self._watched = tuple(watched)
        self._trigger = cache.trigger(*watched, name=self.name)

    # -- the data --------------------------------------------------------------------------

    def desired(self) -> dict[str, str]:
        """The data the ConfigMap should hold now; raises ``CacheError`` while a kind is not synced."""
        classes: list[GPUClassView] = []
        loose_names: list[str] = []
        for obj in self._cache.store(specs.GPU_CLASSES).list():
            try:
                classes.append(gpu_class_view(obj))
            except (InvalidObject, ValueError) as err:
                # The model cannot read the offer, but it still sells its resource name.
                name = (obj.get("spec") or {}).get("resourceName")
                if isinstance(name, str):
                    loose_names.append(name)
                _log.warning("unreadable GPUClass", name=obj["metadata"]["name"], error=str(err))
        inventories: list[NodeInventory] = []
        kubevirts: list[Mapping[str, Any]] = []
        if self._gpu:
            inventories = [node_inventory(obj) for obj in self._cache.store(specs.GPU_NODES).list()]
            try:
                kubevirts = list(self._cache.store(specs.KUBEVIRTS).list())
            except KindNotServed:
                kubevirts = []
        names = effective_names(hoster=(*self._hoster, *loose_names), classes=classes, inventories=inventories,
                                permitted=permitted_host_devices(kubevirts))
        return settings_data(resource_names=names, raw_names=self._raw_names, gpu_enabled=self._gpu)

    # -- one pass --------------------------------------------------------------------------

    async def publish_once(self) -> bool:
        """Make the ConfigMap match; returns whether it wrote."""
        desired = self.desired()
        for _ in range(_WRITE_ATTEMPTS):
            current = await self._client.get_or_none(self._path)
            try:
                if current is None:
                    body: Obj = {
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": keys.SETTINGS_CONFIGMAP, "namespace": self._namespace},
                        "data": desired,
                    }
                    await self._client.create(self._collection, body)
                else:
                    data = current.get("data") or {}
                    if all(data.get(key) == value for key, value in desired.items()):
                        return False
                    body = {**current, "data": {**data, **desired}}
                    body["metadata"] = {k: v for k, v in current["metadata"].items() if k != "managedFields"}
                    await self._client.replace(self._path, body)
            except (errors.Conflict, errors.AlreadyExists):
                continue  # someone wrote it since we read it: read again
            _log.info("published the settings ConfigMap", data=desired)
            if self._metrics is not None:
                self._metrics.writes.inc()
            return True
        raise errors.Conflict(409, {"reason": "Conflict", "message": f"still conflicting after {_WRITE_ATTEMPTS} "
                                    "reads"}, method="PUT", path=self._path)

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Leader work: publish now, then on every change and every resync, until cancelled."""
        self._trigger.poll()  # whatever fired while not leading is covered by the first pass
        backoff = 1.0
        while True:
            wait = self._resync
            try:
                await self.publish_once()
                backoff = 1.0
            except (errors.KubeError, CacheError) as err:
                if self._metrics is not None:
                    self._metrics.failures.inc()
                waiting = isinstance(err, CacheError)
                log = _log.info if waiting else _log.warning
                log("settings not published yet" if waiting else "publishing the settings failed", error=str(err))
                wait, backoff = backoff, min(backoff * 2, self._max_backoff)
            except Exception as err:  # a bug on some object's path: both replicas would crash-loop on it
                if self._metrics is not None:
                    self._metrics.failures.inc()
                _log.error("publishing the settings failed unexpectedly", error=f"{type(err).__name__}: {err}",
                           exc_info=True)
                wait, backoff = backoff, min(backoff * 2, self._max_backoff)
            try:
                async with asyncio.timeout(wait):
                    await self._trigger.wait()
            except TimeoutError:
                pass
