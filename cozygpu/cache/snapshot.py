"""Turn the informer cache's raw objects into the model's Snapshot.

Why: the model is pure and typed; the cache holds Kubernetes JSON. This
module is the one place that reads our CRDs' field names (SPEC 1) and the
Kubernetes and KubeVirt fields the model needs, so every caller (binder,
webhooks, catalog, CLI) builds the same snapshot from the same objects.

Contract:
- A pure function of iterables of JSON mappings (as the cache stores them;
  never mutated) plus ``now``: no I/O, no clock reads. It imports nothing
  else from ``cozygpu.cache``.
- An object that cannot be read (a GPUClass with an unknown mode, a
  GPUDevice without a class or count) is left out and reported through
  ``on_invalid`` so the caller can log it; an unreadable *budget* is not
  left out: it reaches the model, which refuses orders under it.
- Only ResourceQuotas named ``tenant-quota`` are budgets. Only pods that
  request an extended resource, or that a VMI lists as active, are kept.
- :func:`build_snapshot` is the entry point and the reference. A caller
  that builds often passes a :class:`ViewMemo` so unchanged objects are not
  converted again; the per-object converters are public too. The binder
  keeps a :class:`LiveSnapshot` instead, fed the cache's events: a pass
  after a device change converts and re-derives only what changed, and
  equals ``build_snapshot`` over the same objects (property-tested).
- A build pauses the cyclic garbage collector while it runs and restores it
  afterwards (see ``cozygpu.cache.collector``): that is its only effect beyond
  its result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeGuard, TypeVar

import attrs

from cozygpu import keys
from cozygpu.cache.collector import collector_paused
from cozygpu.cache.specs import SNAPSHOT_SPECS
from cozygpu.cache.store import Event
from cozygpu.model.assemble import Assembly, assemble
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE, DEFAULT_REPORT_STALE_AFTER, served_units
from cozygpu.model.pods import InitContainer, PodResources, container_requests, pod_requests, whole_requests
from cozygpu.model.snapshot import (
    Attachment,
    BindAnswer,
    BindRequest,
    DeviceView,
    GPUClassView,
    LabelSelector,
    MediatedDevice,
    Mode,
    NamespaceView,
    NodeInventory,
    NodeSelectorTerm,
    NodeView,
    OnCordon,
    PciHostDevice,
    PermittedHostDevices,
    Phase,
    PodPhase,
    PodView,
    SelectorRequirement,
    Snapshot,
    Taint,
    Toleration,
    VMIView,
)

Obj = Mapping[str, Any]
#: Called with (kind, object, problem) for an object left out of the snapshot.
InvalidHandler = Callable[[str, Obj, str], None]

_EMPTY: Mapping[str, Any] = {}
_PHASES = {p.value: p for p in Phase}
_PENDING = Phase.PENDING
_POD_PHASES = {p.value: p for p in PodPhase}


class InvalidObject(ValueError):
    """An object the snapshot cannot use."""


def _is_map(value: object) -> TypeGuard[Mapping[str, Any]]:
    # dict first and None next: the cache's objects are dicts, a missing field
    # is None, and the Mapping ABC check is slow for everything else.
    if isinstance(value, dict):
        return True
    return value is not None and isinstance(value, Mapping)


def _map(value: object) -> Mapping[str, Any]:
    return value if _is_map(value) else _EMPTY


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: object) -> str:
    return value if type(value) is str else ""


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tolerations(items: object) -> tuple[Toleration, ...]:
    if not items:  # the common case: none set
        return ()
    return tuple(
        Toleration(
            key=_str(t.get("key")),
            operator=_str(t.get("operator")) or "Equal",
            value=_str(t.get("value")),
            effect=_str(t.get("effect")),
        )
        for t in _list(items)
        if _is_map(t)
    )


def _selector(value: object) -> LabelSelector | None:
    if not _is_map(value):
        return None
    labels = tuple(sorted((str(k), str(v)) for k, v in _map(value.get("matchLabels")).items()))
    return LabelSelector(match_labels=labels, match_expressions=_requirements(value.get("matchExpressions")))


def gpu_class_view(obj: Obj) -> GPUClassView:
    meta = _map(obj.get("metadata"))
    spec = _map(obj.get("spec"))
    name = _str(meta.get("name"))
    try:
        mode = Mode(_str(spec.get("mode")))
    except ValueError:
        raise InvalidObject(f"spec.mode {spec.get('mode')!r} is not Passthrough or VGPU") from None
    resource_name = _str(spec.get("resourceName"))
    if not name or not resource_name:
        raise InvalidObject("a GPUClass needs metadata.name and spec.resourceName")
    try:
        on_cordon = OnCordon(spec.get("onCordon") or OnCordon.MOVE)
    except ValueError:
        on_cordon = OnCordon.MOVE
    return GPUClassView(
        name=name,
        mode=mode,
        resource_name=resource_name,
        vendor=_str(spec.get("vendor")),
        model=_str(spec.get("model")),
        profile=_str(spec.get("profile")),
        memory=str(spec.get("memory") or ""),
        max_count=_int(spec.get("maxCount")),
        node_selector=_selector(spec.get("nodeSelector")),
        on_cordon=on_cordon,
        tolerations=_tolerations(spec.get("tolerations")),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def device_view(obj: Obj) -> DeviceView:
    # The hottest converter (every GPUDevice, every build): plain lookups, and
    # the helpers inlined for what the cache holds (dicts and strs); anything
    # else still goes through them, so every shape reads as before.
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = _map(meta)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = _map(spec)
    status = obj.get("status")
    if not isinstance(status, dict):
        status = _map(status)
    count = spec.get("count")
    class_name = spec.get("className")
    if type(count) is not int or type(class_name) is not str or not class_name:
        raise InvalidObject("a GPUDevice needs spec.className and an integer spec.count")
    attachment = None
    raw_attachment = status.get("attachment")
    if raw_attachment is not None and _is_map(raw_attachment) and raw_attachment.get("vmi"):
        attachment = Attachment(
            vmi=_str(raw_attachment.get("vmi")),
            uid=_str(raw_attachment.get("uid")),
            attached_at=_time(raw_attachment.get("attachedAt")),
            request_id=_str(raw_attachment.get("requestId")),
        )
    request = None
    raw_request = status.get("bindRequest")
    if raw_request is not None and _is_map(raw_request) and raw_request.get("id"):
        request = BindRequest(
            id=_str(raw_request.get("id")), vmi=_str(raw_request.get("vmi")), time=_time(raw_request.get("time"))
        )
    answer = None
    raw_answer = status.get("bindAnswer")
    if raw_answer is not None and _is_map(raw_answer) and raw_answer.get("id"):
        answer = BindAnswer(
            id=_str(raw_answer.get("id")),
            result=_str(raw_answer.get("result")),
            reason=_str(raw_answer.get("reason")),
            message=_str(raw_answer.get("message")),
            node=_str(raw_answer.get("node")),
            time=_time(raw_answer.get("time")),
        )
    namespace = meta.get("namespace")
    name = meta.get("name")
    uid = meta.get("uid")
    node_name = status.get("nodeName")
    labels = meta.get("labels")
    return DeviceView(
        namespace=namespace if type(namespace) is str else "",
        name=name if type(name) is str else "",
        uid=uid if type(uid) is str else "",
        class_name=class_name,
        count=count,
        phase=_PHASES.get(status.get("phase"), _PENDING),  # type: ignore[arg-type]
        node_name=node_name if type(node_name) is str and node_name else None,
        attachment=attachment,
        bind_request=request,
        bind_answer=answer,
        template=labels is not None and _is_map(labels) and keys.TEMPLATE_DEVICE_LABEL in labels,
        deleting=bool(meta.get("deletionTimestamp")),
        created=_time(meta.get("creationTimestamp")),
    )


def node_inventory(obj: Obj) -> NodeInventory:
    meta = _map(obj.get("metadata"))
    status = _map(obj.get("status"))
    entries: list[tuple[str, int]] = []
    for device in _list(status.get("devices")):
        if _is_map(device):
            name, allocatable = device.get("resourceName"), device.get("allocatable")
            if type(allocatable) is not int:
                allocatable = _int(allocatable) or 0
            entries.append((name if type(name) is str else "", allocatable))
    agent = _map(status.get("agent"))
    return NodeInventory(
        name=_str(meta.get("name")),
        served=served_units(entries),
        resource_names=frozenset(n for n in _list(status.get("resourceNames")) if isinstance(n, str) and n),
        last_report=_time(agent.get("lastReport")),
    )


def node_view(obj: Obj) -> NodeView:
    meta = _map(obj.get("metadata"))
    spec = _map(obj.get("spec"))
    ready = False
    for condition in _list(_map(obj.get("status")).get("conditions")):
        if _is_map(condition) and condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
    taints = tuple(
        Taint(key=_str(t.get("key")), value=_str(t.get("value")), effect=_str(t.get("effect")))
        for t in _list(spec.get("taints"))
        if _is_map(t)
    )
    return NodeView(
        name=_str(meta.get("name")),
        labels=_map(meta.get("labels")),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        taints=taints,
    )


def _extended(section: Mapping[str, Any]) -> Mapping[str, Any]:
    return {k: v for k, v in section.items() if "/" in k}


def _requests(container: Mapping[str, Any], *, extended_only: bool) -> dict[str, Any]:
    resources = _map(container.get("resources"))
    requests, limits = _map(resources.get("requests")), _map(resources.get("limits"))
    if extended_only:
        requests, limits = _extended(requests), _extended(limits)
    return container_requests(requests, limits)


def pod_resources(spec: Mapping[str, Any], *, extended_only: bool = False) -> PodResources:
    """The parts of a pod spec the scheduler's arithmetic reads. Raises QuantityError on a bad quantity.

    With ``extended_only`` only extended resources (``domain/name``) are
    read: all a snapshot needs, and far fewer quantities to parse.
    """
    containers = tuple(_requests(c, extended_only=extended_only) for c in _list(spec.get("containers")) if _is_map(c))
    inits = tuple(
        InitContainer(requests=_requests(c, extended_only=extended_only), sidecar=c.get("restartPolicy") == "Always")
        for c in _list(spec.get("initContainers"))
        if _is_map(c)
    )
    overhead, pod_level = _map(spec.get("overhead")), _map(_map(spec.get("resources")).get("requests"))
    if extended_only:
        overhead, pod_level = _extended(overhead), _EMPTY
    return PodResources(
        containers=containers,
        init_containers=inits,
        overhead=container_requests(overhead, _EMPTY),
        pod_level=container_requests(pod_level, _EMPTY),
    )


def asks_extended(spec: Mapping[str, Any]) -> bool:
    """Whether a pod spec requests or limits an extended resource (``domain/name``) in any container."""
    for field in ("containers", "initContainers"):
        for container in _list(spec.get(field)):
            if not _is_map(container):
                continue
            resources = _map(container.get("resources"))
            for section in ("requests", "limits"):
                if any("/" in name for name in _map(resources.get(section))):
                    return True
    return False


def _whole(value: object) -> int | None:
    """A quantity that is a plain whole number (``2``, ``"2"``), else None (left to ``parse_quantity``)."""
    if type(value) is int:
        return value
    if type(value) is str and value.isdigit() and value.isascii():
        return int(value)
    return None


def _plain_requests(spec: Mapping[str, Any]) -> dict[str, int] | None:
    """The extended requests of a plain pod without Fractions, or None when it is not plain.

    Plain: no init containers, no overhead, and every extended quantity a
    whole number. Most GPU pods are (a launcher is one container with
    ``limits: {nvidia.com/X: "1"}``), and for them the scheduler's arithmetic
    is just the sum over containers of each one's request, or its limit when
    it sets no request. Anything else returns None and takes the general path
    (``pod_resources`` -> ``pod_requests`` -> ``whole_requests``), which gives
    the same answer on plain pods and reports bad quantities.
    """
    if spec.get("initContainers") or spec.get("overhead"):
        return None
    total: dict[str, int] = {}
    for container in _list(spec.get("containers")):
        if not _is_map(container):
            continue
        resources = _map(container.get("resources"))
        merged: dict[str, int] = {}
        for section in (_map(resources.get("limits")), _map(resources.get("requests"))):  # a request wins
            for name, value in section.items():
                if "/" in name:
                    amount = _whole(value)
                    if amount is None:
                        return None
                    merged[name] = amount
        for name, amount in merged.items():
            total[name] = total.get(name, 0) + amount
    return {name: amount for name, amount in total.items() if amount > 0}


def pod_view(obj: Obj) -> PodView:
    meta = _map(obj.get("metadata"))
    spec = _map(obj.get("spec"))
    status = _map(obj.get("status"))
    requests = _plain_requests(spec)
    if requests is None:
        requests = whole_requests(pod_requests(pod_resources(spec, extended_only=True))) if asks_extended(spec) else {}
    return PodView(
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        uid=_str(meta.get("uid")),
        node_name=_str(spec.get("nodeName")) or None,
        phase=_POD_PHASES.get(_str(status.get("phase")), PodPhase.PENDING),
        requests=requests,
        claims_vmi=_claimed_vmi(meta.get("ownerReferences")),
        created=_time(meta.get("creationTimestamp")),
    )


def _claimed_vmi(owners: object) -> tuple[str, str] | None:
    """The (name, UID) of a controller ownerReference to a KubeVirt VMI: what the pod claims to launch."""
    for owner in _list(owners):
        if (isinstance(owner, Mapping) and owner.get("controller") is True
                and owner.get("kind") == "VirtualMachineInstance"
                and _str(owner.get("apiVersion")).startswith("kubevirt.io/")):
            return _str(owner.get("name")), _str(owner.get("uid"))
    return None


def vmi_view(obj: Obj) -> VMIView:
    meta = _map(obj.get("metadata"))
    spec = _map(obj.get("spec"))
    status = _map(obj.get("status"))
    return VMIView(
        namespace=_str(meta.get("namespace")),
        name=_str(meta.get("name")),
        uid=_str(meta.get("uid")),
        phase=_str(status.get("phase")),
        node_name=_str(status.get("nodeName")) or None,
        active_pods=frozenset(map(str, _map(status.get("activePods")))),
        tolerations=_tolerations(spec.get("tolerations")),
        node_selector={str(k): str(v) for k, v in _map(spec.get("nodeSelector")).items()},
        node_affinity=_required_node_affinity(spec.get("affinity")),
    )


def _requirements(items: object) -> tuple[SelectorRequirement, ...]:
    return tuple(
        SelectorRequirement(
            key=_str(e.get("key")),
            operator=_str(e.get("operator")),
            values=tuple(str(v) for v in _list(e.get("values"))),
        )
        for e in _list(items)
        if _is_map(e)
    )


def _required_node_affinity(affinity: object) -> tuple[NodeSelectorTerm, ...] | None:
    """``nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``; None when not set."""
    required = _map(_map(_map(affinity).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return None
    return tuple(
        NodeSelectorTerm(
            match_expressions=_requirements(term.get("matchExpressions")),
            match_fields=_requirements(term.get("matchFields")),
        )
        for term in _list(required.get("nodeSelectorTerms"))
        if _is_map(term)
    )


def namespace_view(obj: Obj) -> NamespaceView:
    meta = _map(obj.get("metadata"))
    return NamespaceView(name=_str(meta.get("name")), labels=_map(meta.get("labels")))


def permitted_host_devices(kubevirts: Iterable[Obj]) -> PermittedHostDevices | None:
    """The union of ``permittedHostDevices`` over KubeVirt CRs; None when none configures the table."""
    pci: list[PciHostDevice] = []
    mediated: list[MediatedDevice] = []
    configured = False
    for obj in kubevirts:
        table = _map(_map(obj.get("spec")).get("configuration")).get("permittedHostDevices")
        if not _is_map(table):
            continue
        configured = True
        for entry in _list(table.get("pciHostDevices")):
            if _is_map(entry):
                pci.append(
                    PciHostDevice(
                        selector=_str(entry.get("pciVendorSelector")), resource_name=_str(entry.get("resourceName"))
                    )
                )
        for entry in _list(table.get("mediatedDevices")):
            if _is_map(entry):
                mediated.append(
                    MediatedDevice(
                        selector=_str(entry.get("mdevNameSelector")), resource_name=_str(entry.get("resourceName"))
                    )
                )
    return PermittedHostDevices(pci=tuple(pci), mediated=tuple(mediated)) if configured else None


def tenant_quotas(quotas: Iterable[Obj]) -> dict[str, Mapping[str, Any]]:
    """Namespace -> ``spec.hard`` of its ``tenant-quota`` ResourceQuota."""
    found: dict[str, Mapping[str, Any]] = {}
    for obj in quotas:
        meta = _map(obj.get("metadata"))
        if meta.get("name") == keys.TENANT_QUOTA_NAME:
            found[_str(meta.get("namespace"))] = _map(_map(obj.get("spec")).get("hard"))
    return found


class ViewMemo:
    """Views of unchanged objects, reused from one build to the next.

    The binder builds a snapshot every pass and most objects have not changed
    since the last one. A view depends only on its object, so it is kept by
    (kind, namespace, name) with the resourceVersion it was made from; an
    object without a resourceVersion is always converted. Each build forgets
    the objects it did not see, so deleted objects do not pile up. One memo
    per caller; not safe to share between threads.
    """

    def __init__(self) -> None:
        self._views: dict[tuple[str, str, str], tuple[str, Any, str]] = {}
        self._seen: set[tuple[str, str, str]] = set()

    def convert(self, kind: str, obj: Obj, convert: Callable[[Obj], Any]) -> Any:
        meta = _map(obj.get("metadata"))
        version = meta.get("resourceVersion")
        if not version:
            return convert(obj)
        key = (kind, _str(meta.get("namespace")), _str(meta.get("name")))
        self._seen.add(key)
        kept = self._views.get(key)
        if kept is not None and kept[0] == version:
            if kept[2]:
                raise InvalidObject(kept[2])
            return kept[1]
        try:
            view = convert(obj)
        except ValueError as error:
            self._views[key] = (version, None, str(error) or type(error).__name__)
            raise
        self._views[key] = (version, view, "")
        return view

    def forget_unseen(self) -> None:
        """Drop what the last build did not see; call once per build."""
        for key in self._views.keys() - self._seen:
            del self._views[key]
        self._seen.clear()

    def __len__(self) -> int:
        return len(self._views)


def _convert(
    kind: str,
    objects: Iterable[Obj],
    convert: Callable[[Obj], Any],
    on_invalid: InvalidHandler | None,
    memo: ViewMemo | None,
) -> list[Any]:
    views = []
    for obj in objects:
        try:
            views.append(memo.convert(kind, obj, convert) if memo is not None else convert(obj))
        except ValueError as error:  # InvalidObject and QuantityError
            if on_invalid is not None:
                on_invalid(kind, obj, str(error))
    return views


def build_snapshot(
    *,
    now: datetime,
    classes: Iterable[Obj] = (),
    devices: Iterable[Obj] = (),
    gpunodes: Iterable[Obj] = (),
    nodes: Iterable[Obj] = (),
    pods: Iterable[Obj] = (),
    vmis: Iterable[Obj] = (),
    quotas: Iterable[Obj] = (),
    namespaces: Iterable[Obj] = (),
    kubevirts: Iterable[Obj] = (),
    hoster_names: Iterable[str] = (),
    report_stale_after: timedelta = DEFAULT_REPORT_STALE_AFTER,
    launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE,
    on_invalid: InvalidHandler | None = None,
    memo: ViewMemo | None = None,
) -> Snapshot:
    """The model's Snapshot from the cache's objects, as of ``now``.

    Pass the same ``memo`` to every build of one caller to reuse the views
    of objects whose resourceVersion did not change.
    """
    with collector_paused():  # tens of thousands of acyclic, long-lived views
        vmi_views: list[VMIView] = _convert("VirtualMachineInstance", vmis, vmi_view, on_invalid, memo)
        wanted = _pods_wanted(vmi_views)
        class_views = _convert(keys.GPUCLASS_KIND, classes, gpu_class_view, on_invalid, memo)
        device_views = _convert(keys.GPUDEVICE_KIND, devices, device_view, on_invalid, memo)
        node_views = _convert("Node", nodes, node_view, on_invalid, memo)
        inventory_views = _convert(keys.GPUNODE_KIND, gpunodes, node_inventory, on_invalid, memo)
        pod_views = _convert("Pod", (p for p in pods if wanted(p)), pod_view, on_invalid, memo)
        namespace_views = _convert("Namespace", namespaces, namespace_view, on_invalid, memo)
        if memo is not None:
            memo.forget_unseen()
        return assemble(
            now=now,
            classes=class_views,
            devices=device_views,
            nodes=node_views,
            inventories=inventory_views,
            pods=pod_views,
            vmis=vmi_views,
            namespaces=namespace_views,
            quotas=tenant_quotas(quotas),
            hoster_names=hoster_names,
            permitted=permitted_host_devices(kubevirts),
            report_stale_after=report_stale_after,
            launcher_grace=launcher_grace,
        )


#: The kinds a snapshot is built from, by the names ``LiveSnapshot`` takes them under.
LIVE_KINDS: tuple[str, ...] = tuple(SNAPSHOT_SPECS)


ViewT = TypeVar("ViewT")


class Source:
    """One kind as the caller reads it at snapshot time: its store (by identity), its objects, one of them."""

    def __init__(self, identity: object, objects: Callable[[], Iterable[Obj]],
                 get: Callable[[str, str], Obj | None]) -> None:
        self.identity = identity
        self.objects = objects
        self.get = get


class LiveSnapshot:
    """The snapshot of an informer cache, kept up to date from its events (the binder's, every pass).

    kube-scheduler's ``UpdateSnapshot`` is the idea: keep the last snapshot
    and redo only what moved since. The caller hands every event of the
    kinds in ``LIVE_KINDS`` to :meth:`changed` (a store handler: synchronous,
    cheap: it only notes the key, after comparing the two states' views where
    a heartbeat would otherwise count) and asks :meth:`snapshot` with each
    kind's current store. Then:

    - only devices changed, or VMIs whose active pods stayed the same (a VMI
      coming before its launcher, changing phase or node, going without
      one): each is converted again and ``Assembly.update`` re-derives what
      it touches (a device's indexes, the units it holds, its namespace's
      ancestry, the launchers of its VMI; a VMI's launchers' usage; the
      capacity and availability on their nodes) — what a bind request, an
      answer or a VM start costs;
    - anything else changed that a view reads (a class, a Node's labels or
      Ready or taints, a report, a GPU pod or a launcher, a VMI's active
      pods, a budget, a namespace, KubeVirt), a report turned stale with
      ``now``, or a kind's store was replaced (served again): every view is
      taken again through the memo (unchanged objects are not converted)
      and ``Assembly.rebuild`` derives everything;
    - nothing changed: the last snapshot, with ``now`` moved on.

    The result equals :func:`build_snapshot` over the same objects, up to
    the order of the device index tuples (sorted by key here): the property
    test in ``tests/cache`` drives both through random event sequences.
    Not safe to share between threads; one per caller.
    """

    def __init__(
        self,
        *,
        hoster_names: Iterable[str] = (),
        report_stale_after: timedelta = DEFAULT_REPORT_STALE_AFTER,
        launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE,
        on_invalid: InvalidHandler | None = None,
    ) -> None:
        self._hoster = tuple(hoster_names)
        self._stale_after = report_stale_after
        self._on_invalid = on_invalid
        self._grace = launcher_grace
        self._assembly = Assembly(hoster_names=self._hoster, report_stale_after=report_stale_after,
                                  launcher_grace=launcher_grace)
        self._memo = ViewMemo()
        self._identities: dict[str, object] = {}
        self._devices: set[tuple[str, str]] = set()
        self._vmis: set[tuple[str, str]] = set()
        #: GPUNodes whose report changed but kept its names: an update of that one node.
        self._reports: set[tuple[str, str]] = set()
        #: Nodes whose view changed (or that came or went): which classes may use them.
        self._nodes: set[tuple[str, str]] = set()
        #: GPU pods and launchers that changed, came or went: each one's contribution, swapped.
        self._pods: set[tuple[str, str]] = set()
        self._rebuild = True
        #: Why the last snapshot was rebuilt or updated, and how many objects it converted (for benches, logs).
        self.last_step = ""

    def changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Note one change (``old`` None when added, ``new`` None when deleted). Never raises."""
        if self._rebuild:
            return
        if kind == keys.GPUDEVICE_KIND:
            self._devices.add(_key_of(new or old or _EMPTY))
            return
        if kind == "VirtualMachineInstance":
            self._vmi_changed(old, new)
            return
        if not self.matters(kind, old, new):
            return
        if kind == "Node":
            self._nodes.add(_key_of(new or old or _EMPTY))
            return
        if kind == "Pod":
            self._pods.add(_key_of(new or old or _EMPTY))
            return
        if kind == keys.GPUNODE_KIND and old is not None and new is not None:
            try:
                if Assembly.same_names(node_inventory(old), node_inventory(new)):
                    self._reports.add(_key_of(new))
                    return
            except ValueError:
                pass
        self._rebuild = True

    def matters(self, kind: str, old: Obj | None, new: Obj | None) -> bool:
        """Whether a change of an object of ``kind`` (not a device or VMI) moves anything a decision reads.

        A heartbeat (a Node's, a quota's usage, a status field no view holds) does not, and neither does
        any change of a pod that asks for no extended resource and launches no VMI here.
        """
        convert = _SAME_VIEW.get(kind)
        if convert is not None and old is not None and new is not None:
            try:
                if convert(old) == convert(new):
                    return False
            except ValueError:
                pass
        return not (kind == "Pod" and not self._wanted_pod(old) and not self._wanted_pod(new))

    def _vmi_changed(self, old: Obj | None, new: Obj | None) -> None:
        """Nothing when its view stayed the same; an update when its active pods did; else a rebuild."""
        try:
            before = vmi_view(old) if old is not None else None
            after = vmi_view(new) if new is not None else None
        except ValueError:
            self._rebuild = True
            return
        if before is not None and before == after:
            return  # nothing a decision reads moved
        if (before.active_pods if before else frozenset()) != (after.active_pods if after else frozenset()):
            self._rebuild = True  # which pods the snapshot holds follows from them
            return
        self._vmis.add(_key_of(new or old or _EMPTY))

    def handler(self, kind: str) -> Callable[[Event], None]:
        """A store handler that notes the events of ``kind`` (subscribe it to that kind's informer)."""

        def changed(event: Event) -> None:
            self.changed(kind, event.old, None if event.type == "DELETED" else event.obj)

        return changed

    @property
    def dirty(self) -> bool:
        """Whether a change was noted since the last snapshot (heartbeats are not)."""
        return self._rebuild or any((self._devices, self._vmis, self._reports, self._nodes, self._pods))

    def _wanted_pod(self, pod: Obj | None) -> bool:
        if pod is None:
            return False
        current = self._assembly.current
        uid = _str(_map(pod.get("metadata")).get("uid"))
        return (current is not None and uid in current.launchers) or asks_extended(_map(pod.get("spec")))

    def snapshot(self, *, now: datetime, sources: Mapping[str, Source | None]) -> Snapshot:
        """The snapshot of ``now`` over ``sources`` (kind -> its store; None while the kind is not served)."""
        identities = {kind: (source.identity if source is not None else None) for kind, source in sources.items()}
        if identities != self._identities:
            self._identities = identities
            self._rebuild = True
        if self._rebuild or self._assembly.needs_rebuild(now):
            return self._build(now, sources)
        changes: dict[tuple[str, str], DeviceView | None] = self._views(
            keys.GPUDEVICE_KIND, self._devices, sources.get(keys.GPUDEVICE_KIND), device_view)
        vmi_changes: dict[tuple[str, str], VMIView | None] = self._views(
            "VirtualMachineInstance", self._vmis, sources.get("VirtualMachineInstance"), vmi_view)
        reports: dict[tuple[str, str], NodeInventory | None] = self._views(
            keys.GPUNODE_KIND, self._reports, sources.get(keys.GPUNODE_KIND), node_inventory)
        nodes: dict[tuple[str, str], NodeView | None] = self._views(
            "Node", self._nodes, sources.get("Node"), node_view)
        pod_source = sources.get("Pod")
        pods: dict[tuple[str, str], PodView | None] = self._views(
            "Pod", (k for k in self._pods if pod_source is None or self._wanted_pod(pod_source.get(*k))),
            pod_source, pod_view)
        pods.update((key, None) for key in self._pods if key not in pods)  # no longer one the snapshot holds
        self._forget_changes()
        inventories = {key[1]: view for key, view in reports.items() if view is not None}
        if len(inventories) < len(reports):  # gone or unreadable since: not a change of one node's report
            return self._build(now, sources)
        self.last_step = (f"update of {len(changes)} device(s)" + (f" and {len(vmi_changes)} VMI(s)"
                                                                   if vmi_changes else "")
                          + (f" and {len(inventories)} report(s)" if inventories else "")
                          + (f" and {len(nodes)} node(s)" if nodes else "")
                          + (f" and {len(pods)} pod(s)" if pods else ""))
        try:
            return self._assembly.update(now=now, devices=changes, vmis=vmi_changes, inventories=inventories,
                                         nodes={key[1]: view for key, view in nodes.items()}, pods=pods)
        except ValueError:  # a report's names changed after all: its later state is what the stores hold
            return self._build(now, sources)

    async def verify(self, *, now: datetime, sources: Mapping[str, Source | None],
                     slice_size: int = 2000) -> str | None:
        """Build the model again from the stores and compare it with the live one (R-BIND-1's safety net).

        The live snapshot and the stores' objects are taken in one step of the event loop, so both are
        of the same instant; the views are then converted afresh (no memo: a memo fault must not hide),
        ``slice_size`` objects at a time with the loop let go between. On a difference the next
        snapshot is rebuilt from the stores; the first differing field and key are returned.
        """
        live = self.snapshot(now=now, sources=sources)
        objects = {kind: list(source.objects()) if source is not None else [] for kind, source in sources.items()}
        views: dict[str, list[Any]] = {}
        for kind, convert in _VIEWS.items():
            found: list[Any] = []
            listed = objects.get(kind, [])
            if kind == "Pod":
                wanted = _pods_wanted(views["VirtualMachineInstance"])
                listed = [p for p in listed if wanted(p)]
            for start in range(0, len(listed), slice_size):
                found += _convert(kind, listed[start:start + slice_size], convert, None, None)
                await asyncio.sleep(0)
            views[kind] = found
        fresh = Assembly(hoster_names=self._hoster, report_stale_after=self._stale_after,
                         launcher_grace=self._grace).rebuild(
            now=now, classes=views[keys.GPUCLASS_KIND], devices=views[keys.GPUDEVICE_KIND], nodes=views["Node"],
            inventories=views[keys.GPUNODE_KIND], pods=views["Pod"], vmis=views["VirtualMachineInstance"],
            namespaces=views["Namespace"], quotas=tenant_quotas(objects.get("ResourceQuota", [])),
            permitted=permitted_host_devices(objects.get("KubeVirt", [])))
        drift = first_difference(live, fresh)
        if drift is not None:
            self._rebuild = True
        return drift

    def _forget_changes(self) -> None:
        for noted in (self._devices, self._vmis, self._reports, self._nodes, self._pods):
            noted.clear()

    def _views(self, kind: str, wanted: Iterable[tuple[str, str]], source: Source | None,
               convert: Callable[[Obj], ViewT]) -> dict[tuple[str, str], ViewT | None]:
        """The current view of each key (None when gone or unreadable; an unreadable one is reported)."""
        out: dict[tuple[str, str], ViewT | None] = {}
        for key in wanted:
            obj = source.get(*key) if source is not None else None
            view: ViewT | None = None
            if obj is not None:
                try:
                    view = self._memo.convert(kind, obj, convert)
                except ValueError as error:
                    if self._on_invalid is not None:
                        self._on_invalid(kind, obj, str(error))
            out[key] = view
        return out

    def _build(self, now: datetime, sources: Mapping[str, Source | None]) -> Snapshot:
        def objects(kind: str) -> Iterable[Obj]:
            source = sources.get(kind)
            return source.objects() if source is not None else ()

        self._rebuild = False
        self._forget_changes()
        memo, on_invalid = self._memo, self._on_invalid
        with collector_paused():
            vmi_views: list[VMIView] = _convert("VirtualMachineInstance", objects("VirtualMachineInstance"), vmi_view,
                                                on_invalid, memo)
            wanted = _pods_wanted(vmi_views)
            snapshot = self._assembly.rebuild(
                now=now,
                classes=_convert(keys.GPUCLASS_KIND, objects(keys.GPUCLASS_KIND), gpu_class_view, on_invalid, memo),
                devices=_convert(keys.GPUDEVICE_KIND, objects(keys.GPUDEVICE_KIND), device_view, on_invalid, memo),
                nodes=_convert("Node", objects("Node"), node_view, on_invalid, memo),
                inventories=_convert(keys.GPUNODE_KIND, objects(keys.GPUNODE_KIND), node_inventory, on_invalid,
                                     memo),
                pods=_convert("Pod", (p for p in objects("Pod") if wanted(p)), pod_view, on_invalid, memo),
                vmis=vmi_views,
                namespaces=_convert("Namespace", objects("Namespace"), namespace_view, on_invalid, memo),
                quotas=tenant_quotas(objects("ResourceQuota")),
                permitted=permitted_host_devices(objects("KubeVirt")),
            )
            memo.forget_unseen()
        self.last_step = "rebuild"
        return snapshot


def _pods_wanted(vmis: Iterable[VMIView]) -> Callable[[Obj], bool]:
    """The pods a snapshot holds: every VMI's active pods (launchers) and any pod asking for extended resources."""
    active = {uid for vmi in vmis for uid in vmi.active_pods}

    def wanted(pod: Obj) -> bool:
        return _str(_map(pod.get("metadata")).get("uid")) in active or asks_extended(_map(pod.get("spec")))

    return wanted


#: The kinds converted into views one by one, each with its converter (VMIs first: they decide which pods).
_VIEWS: dict[str, Callable[[Obj], Any]] = {
    "VirtualMachineInstance": vmi_view, keys.GPUCLASS_KIND: gpu_class_view, keys.GPUDEVICE_KIND: device_view,
    "Node": node_view, keys.GPUNODE_KIND: node_inventory, "Pod": pod_view, "Namespace": namespace_view,
}


def first_difference(live: Snapshot, fresh: Snapshot) -> str | None:
    """The first field (and key in it) where two snapshots differ, or None when they are the same.

    Device index tuples are compared as sets: the order of a bucket means nothing.
    """
    for field in attrs.fields(Snapshot):
        a, b = getattr(live, field.name), getattr(fresh, field.name)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            unordered = field.name.startswith("devices_by_")
            for key in sorted(set(a) | set(b), key=repr):
                x, y = a.get(key), b.get(key)
                if unordered and x is not None and y is not None:
                    x, y = frozenset(x), frozenset(y)
                if x != y:
                    return f"{field.name}[{key!r}]"
        elif a != b:
            return field.name
    return None


def _key_of(obj: Obj) -> tuple[str, str]:
    meta = _map(obj.get("metadata"))
    return (_str(meta.get("namespace")), _str(meta.get("name")))


def _inventory_key(obj: Obj) -> object:
    inventory = node_inventory(obj)
    return (inventory.served, inventory.resource_names, inventory.last_report)


#: Kinds whose events often change nothing a view reads (kubelet and agent heartbeats, status writes).
_SAME_VIEW: dict[str, Callable[[Obj], object]] = {
    "Node": node_view,
    keys.GPUNODE_KIND: _inventory_key,
    keys.GPUCLASS_KIND: gpu_class_view,
    "Namespace": namespace_view,
    "Pod": pod_view,
    "ResourceQuota": lambda obj: (_map(obj.get("metadata")).get("name"), _map(obj.get("spec")).get("hard")),
}
