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
- ``deviceClassNames``: the DRA DeviceClasses the GPUClasses sell
  (``spec.source.dra.deviceClassName``, SPEC §1.5) as a sorted JSON list.
  The raw-claims policy refuses a tenant's ResourceClaim or claim template
  of one of them under ``rawNames: forbid``: a claim of a sold DeviceClass
  takes the very devices the binder holds for GPUDevices. (A pod asking for
  such a DeviceClass's extended resource name is already refused by name:
  the class's ``resourceName`` is that name, so it is in ``resourceNames``.)
  A class the model cannot read still sells its DeviceClass, as it still
  sells its resource name: the name is published all the same.
- ``rawNames``: ``allow`` or ``forbid`` (``--raw-gpu-names``).
- ``gpuEnabled``: ``"true"`` or ``"false"``.

Contract (one pass of a ``PassDriver``, its one lane ``publish``; docs/passes.md):
- snapshot: the data from the cache; when the cache's copy of the ConfigMap
  (GPU enabled: its own informer) already holds that data, nothing is to
  write and nothing is read; otherwise the ConfigMap from the API (never from
  the cache, so no write is decided on a stale copy). The binder's GPUNode
  writes trigger a pass each, and a read per pass was a sixth of the
  controller's requests under a stream of orders. plan: write only when one
  of the four keys differs (a ConfigMap an older controller wrote, without
  ``deviceClassNames``, differs); apply: one write, a create (which fails
  if the object appeared meanwhile) or a replace carrying the resourceVersion
  just read. Other keys, labels and annotations on the object (the chart's,
  say) are kept.
- A Conflict or AlreadyExists requeues the pass (read again soon); it is not
  a failure. A kind that has not synced yet makes the pass wait (publishing a
  partial set would let raw names through); KubeVirt not being served means
  no table. Any other error fails the pass, which the driver retries with
  backoff; it never ends leader work.
- Passes run when a GPUClass's or a GPUNode's names change (one is added or
  deleted, or its ``spec.resourceName``, ``spec.source.dra.deviceClassName``
  or ``status.resourceNames`` moves), a KubeVirt CR or the ConfigMap itself
  changes (one coalescing trigger, ``worth_a_pass``), and ``resync`` seconds
  after the last. The
  agents' reports and the binder's own class and GPUNode status writes keep
  the names: at 5,000 nodes each started a pass that decoded every GPUNode
  (78 ms), and they kept the controller's event loop busy most of the time.
  The GPUNodes' names are kept from their events while a term runs
  (``ReportedNames``), so a pass reads them without decoding the fleet — a
  fleet growing by thousands of nodes is thousands of passes.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

import attrs

from cozygpu import keys
from cozygpu.base.clock import Clock
from cozygpu.base.logging import get_logger
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import CacheError, KindNotServed
from cozygpu.cache.store import Event, Store
from cozygpu.kube.client import Obj, resource_path
from cozygpu.model.resource_names import effective_names
from cozygpu.model.snapshot import GPUClassView
from cozygpu.passes.driver import DriverConfig, Lane, PassDriver
from cozygpu.passes.outcomes import Outcome
from cozygpu.passes.writes import Writes
from cozygpu.runtime.metrics import SettingsMetrics
from cozygpu.views import specs
from cozygpu.views.decode import InvalidObject, gpu_class_view, node_inventory, permitted_host_devices

_log = get_logger("cozygpu.settings")

#: The publisher's one lane: a pass over what it publishes, with the driver's resync.
PUBLISH: Final = Lane("publish")


class ConfigMapClient(Protocol):
    async def get_or_none(self, path: str, **kw: Any) -> Obj | None: ...

    async def create(self, path: str, body: Obj, **kw: Any) -> Obj: ...

    async def replace(self, path: str, body: Obj, **kw: Any) -> Obj: ...


@attrs.frozen
class SettingsView:
    """What a pass decides on: the data the cache implies, and the ConfigMap as the API has it now."""

    desired: dict[str, str]
    current: Obj | None


@attrs.frozen
class SettingsWrite:
    create: bool
    body: Obj
    data: dict[str, str]


def settings_data(*, resource_names: Iterable[str], raw_names: str, gpu_enabled: bool,
                  device_class_names: Iterable[str] = ()) -> dict[str, str]:
    """The four keys as the policies read them.

    ``deviceClassNames`` is written even when empty: the raw-claims policy
    refuses while the key is not a JSON list (fail closed), so an empty list
    is how "no class sells a DeviceClass" is said.
    """
    return {
        keys.SETTINGS_RESOURCE_NAMES: _json_list(resource_names),
        keys.SETTINGS_DEVICE_CLASS_NAMES: _json_list(device_class_names),
        keys.SETTINGS_RAW_NAMES: raw_names,
        keys.SETTINGS_GPU_ENABLED: "true" if gpu_enabled else "false",
    }


def _json_list(names: Iterable[str]) -> str:
    """Sorted, unique, compact: equal sets are equal strings, so a pass compares them as strings."""
    return json.dumps(sorted(set(names)), separators=(",", ":"))


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
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._cache = cache
        self._namespace = namespace
        self._hoster = tuple(hoster_names)
        self._raw_names = raw_names
        self._gpu = gpu_enabled
        self._metrics = metrics
        self._path = resource_path("", "v1", "configmaps", namespace=namespace, name=keys.SETTINGS_CONFIGMAP)
        self._collection = resource_path("", "v1", "configmaps", namespace=namespace)
        watched = [specs.GPU_CLASSES]
        #: The ConfigMap's own informer (GPU enabled only): the driver waits for it to see each write.
        self._configmap_spec = specs.settings_configmap(namespace) if gpu_enabled else None
        if self._configmap_spec is not None:
            watched += [specs.GPU_NODES, specs.KUBEVIRTS, self._configmap_spec]
        self._watched = tuple(watched)
        #: The names every GPUNode reports, kept from its events while a term runs (``run``).
        self._reported = ReportedNames()
        #: What starts a pass (see ``worth_a_pass``).
        self.trigger = cache.trigger(*watched, name=self.name, when=self.worth_a_pass())
        self.driver: PassDriver[SettingsView, SettingsWrite | None] = PassDriver(
            self.name, self, cache=cache, lanes=(PUBLISH,), triggers={PUBLISH: [self.trigger]},
            clock=clock, metrics=metrics.passes if metrics is not None else None,
            config=DriverConfig(resync=resync, failure_cap=max_backoff), on_outcome=self._on_outcome,
        )

    @staticmethod
    def worth_a_pass() -> dict[str, Callable[[Event], bool]]:
        """Kind key -> whether one of its events can change the published names (``Cache.trigger``'s ``when``)."""
        return {specs.GPU_NODES.key: _NODE_NAMES_MOVED, specs.GPU_CLASSES.key: _class_names_moved}

    # -- the data --------------------------------------------------------------------------

    def desired(self) -> dict[str, str]:
        """The data the ConfigMap should hold now; raises ``CacheError`` while a kind is not synced."""
        classes: list[GPUClassView] = []
        loose_names: list[str] = []
        device_classes: list[str] = []
        for obj in self._cache.store(specs.GPU_CLASSES).list():
            try:
                view = gpu_class_view(obj)
            except (InvalidObject, ValueError) as err:
                # The model cannot read the offer, but it still sells its resource name and its DeviceClass.
                name = (obj.get("spec") or {}).get("resourceName")
                if isinstance(name, str):
                    loose_names.append(name)
                device_classes += _loose_device_class(obj)
                _log.warning("unreadable GPUClass", name=obj["metadata"]["name"], error=str(err))
                continue
            classes.append(view)
            if view.dra is not None:
                device_classes.append(view.dra.device_class)
        reported: frozenset[str] = frozenset()
        kubevirts: list[Mapping[str, Any]] = []
        if self._gpu:
            reported = self._reported.names(self._cache.store(specs.GPU_NODES))
            try:
                kubevirts = list(self._cache.store(specs.KUBEVIRTS).list())
            except KindNotServed:
                kubevirts = []
        names = effective_names(hoster=(*self._hoster, *loose_names, *reported), classes=classes,
                                permitted=permitted_host_devices(kubevirts))
        return settings_data(resource_names=names, raw_names=self._raw_names, gpu_enabled=self._gpu,
                             device_class_names=device_classes)

    # -- one pass (snapshot -> plan -> apply) ----------------------------------------------

    async def snapshot(self, lane: Lane) -> SettingsView:
        desired = self.desired()
        cached = self._cached()
        if cached is not None and _holds(cached, desired):
            return SettingsView(desired=desired, current=cached)  # nothing to write: no read needed
        return SettingsView(desired=desired, current=await self._client.get_or_none(self._path))

    def _cached(self) -> Obj | None:
        """The cache's copy of the ConfigMap (GPU enabled only), or None."""
        if self._configmap_spec is None:
            return None
        try:
            return self._cache.store(self._configmap_spec).get(self._namespace, keys.SETTINGS_CONFIGMAP)
        except CacheError:
            return None

    def plan(self, view: SettingsView) -> SettingsWrite | None:
        """The one write that makes the ConfigMap match, if it does not."""
        if view.current is None:
            return SettingsWrite(create=True, data=view.desired, body={
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": keys.SETTINGS_CONFIGMAP, "namespace": self._namespace},
                "data": view.desired,
            })
        if _holds(view.current, view.desired):
            return None
        data = view.current.get("data") or {}
        body = {**view.current, "data": {**data, **view.desired}}
        # The resourceVersion read stays in the metadata: the replace's precondition.
        body["metadata"] = {k: v for k, v in view.current["metadata"].items() if k != "managedFields"}
        return SettingsWrite(create=False, data=view.desired, body=body)

    async def apply(self, plan: SettingsWrite | None, writes: Writes) -> None:
        if plan is None:
            return
        if plan.create:
            answer = await self._client.create(self._collection, plan.body)
        else:
            answer = await self._client.replace(self._path, plan.body)
        if self._configmap_spec is not None:
            writes.record_object(self._configmap_spec, answer)
        _log.info("published the settings ConfigMap", data=plan.data)
        if self._metrics is not None:
            self._metrics.writes.inc()

    def _on_outcome(self, lane: Lane, outcome: Outcome, error: Exception | None) -> None:
        if self._metrics is not None and outcome in (Outcome.WAITING, Outcome.FAILED):
            self._metrics.failures.inc()

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Leader work: publish now, then on every change and every resync, until cancelled."""
        unsubscribe = self._reported.follow(self._cache) if self._gpu else None
        try:
            await self.driver.run()
        finally:
            if unsubscribe is not None:
                unsubscribe()


class ReportedNames:
    """The resource names the GPUNodes report (``status.resourceNames``), kept from the cache's events
    while a term runs, so a pass reads them without decoding every GPUNode (at 5,000 nodes a growing
    fleet added thousands, each a pass that decoded them all)."""

    def __init__(self) -> None:
        self._by_node: dict[str, frozenset[str]] = {}
        self._count: Counter[str] = Counter()

    def follow(self, cache: Cache) -> Callable[[], None]:
        """Start from the store as it is and follow its events; returns the unsubscribe function."""
        informer = cache.informer(specs.GPU_NODES)
        with contextlib.suppress(CacheError):
            self._seed(informer.store)
        return informer.subscribe(self._event)

    def names(self, store: Store) -> frozenset[str]:
        """Every name reported; taken from ``store`` again if the events missed one (a count that differs)."""
        if len(store) != len(self._by_node):
            self._seed(store)
        return frozenset(self._count)

    def _seed(self, store: Store) -> None:
        self._by_node.clear()
        self._count.clear()
        for obj in store.list():
            self._set(str(obj["metadata"]["name"]), _reported(obj))

    def _event(self, event: Event) -> None:
        if not _NODE_NAMES_MOVED(event):
            return  # an agent's report or the binder's conditions: nothing to decode
        self._set(str(event.obj["metadata"]["name"]), None if event.type == "DELETED" else _reported(event.obj))

    def _set(self, node: str, names: frozenset[str] | None) -> None:
        before = self._by_node.pop(node, frozenset())
        self._count.subtract(before)
        for name in before:
            if self._count[name] <= 0:
                del self._count[name]
        if names is not None:
            self._by_node[node] = names
            self._count.update(names)


def _reported(obj: Mapping[str, Any]) -> frozenset[str]:
    try:
        return node_inventory(obj).resource_names
    except (InvalidObject, ValueError):
        return frozenset()


def _loose_device_class(obj: Mapping[str, Any]) -> list[str]:
    """``spec.source.dra.deviceClassName`` of a class the model cannot read, if it is a name."""
    name = _device_class_field(obj)
    return [name] if isinstance(name, str) and name else []


def _device_class_field(obj: Mapping[str, Any]) -> object:
    """``spec.source.dra.deviceClassName`` as stored (None where a step is missing or not a map)."""
    value: object = obj
    for step in ("spec", "source", "dra", "deviceClassName"):
        if not isinstance(value, Mapping):
            return None
        value = value.get(step)
    return value


def _names_moved(part: str, field: str) -> Callable[[Event], bool]:
    """An event that adds or deletes the object, or moves ``part.field`` (a name or a list of names)."""

    def moved(event: Event) -> bool:
        if event.type == "DELETED" or event.old is None:
            return True
        return bool((event.old.get(part) or {}).get(field) != (event.obj.get(part) or {}).get(field))

    return moved


_NODE_NAMES_MOVED: Final = _names_moved("status", "resourceNames")


def _class_names_moved(event: Event) -> bool:
    """A class came or went, or its resource name or the DeviceClass it sells moved (both are published)."""
    if event.type == "DELETED" or event.old is None:
        return True
    old, new = event.old, event.obj
    return bool((old.get("spec") or {}).get("resourceName") != (new.get("spec") or {}).get("resourceName")
                or _device_class_field(old) != _device_class_field(new))


def _holds(configmap: Obj, desired: Mapping[str, str]) -> bool:
    """Whether ``configmap`` already holds every key of ``desired`` as it should be."""
    data = configmap.get("data") or {}
    return all(data.get(key) == value for key, value in desired.items())
