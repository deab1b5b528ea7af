"""Decode the informer cache's raw objects into the model's typed views.

Why: the model is pure and typed; the cache holds Kubernetes JSON. This
module is the one place that reads our CRDs' field names (SPEC 1) and the
Kubernetes and KubeVirt fields the model needs, so every reader (binder,
webhooks, catalog, CLI) sees the same views of the same objects.

Contract:
- Pure functions of JSON mappings (as the cache stores them; never
  mutated): no I/O, no clock reads.
- An object that cannot be read (a GPUClass with an unknown mode, a
  GPUDevice without a class or count) raises :class:`InvalidObject`; the
  builders in ``cozygpu.views.build`` leave it out and report it. An
  unreadable *budget* is not left out: it reaches the model, which refuses
  orders under it.
- Only ResourceQuotas named ``tenant-quota`` are budgets. Only pods that
  request an extended resource, or that a VMI lists as active, are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, Final, TypeGuard

from cozygpu import keys
from cozygpu.api.times import parse_time
from cozygpu.base.durations import parse_duration
from cozygpu.model.capacity import served_units
from cozygpu.model.cel import CelError, DeviceAttrs
from cozygpu.model.dra import ClaimView, DeviceRef, SliceDevice, SliceView, TaintRule
from cozygpu.model.pods import InitContainer, PodResources, container_requests, pod_requests, whole_requests
from cozygpu.model.snapshot import (
    Attachment,
    BindAnswer,
    BindRequest,
    CompactionPolicy,
    DeviceView,
    DraSource,
    GPUClassView,
    LabelSelector,
    Ledger,
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
    Taint,
    Toleration,
    VMIView,
)

Obj = Mapping[str, Any]

EMPTY_OBJECT: Mapping[str, Any] = {}
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


def as_map(value: object) -> Mapping[str, Any]:
    return value if _is_map(value) else EMPTY_OBJECT


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: object) -> str:
    return value if type(value) is str else ""


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _tolerations(items: object) -> tuple[Toleration, ...]:
    if not items:  # the common case: none set
        return ()
    return tuple(
        Toleration(
            key=as_str(t.get("key")),
            operator=as_str(t.get("operator")) or "Equal",
            value=as_str(t.get("value")),
            effect=as_str(t.get("effect")),
        )
        for t in _list(items)
        if _is_map(t)
    )


def _selector(value: object) -> LabelSelector | None:
    if not _is_map(value):
        return None
    labels = tuple(sorted((str(k), str(v)) for k, v in as_map(value.get("matchLabels")).items()))
    return LabelSelector(match_labels=labels, match_expressions=_requirements(value.get("matchExpressions")))


def gpu_class_view(obj: Obj) -> GPUClassView:
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    name = as_str(meta.get("name"))
    try:
        mode = Mode(as_str(spec.get("mode")))
    except ValueError:
        raise InvalidObject(f"spec.mode {spec.get('mode')!r} is not Passthrough or VGPU") from None
    resource_name = as_str(spec.get("resourceName"))
    if not name or not resource_name:
        raise InvalidObject("a GPUClass needs metadata.name and spec.resourceName")
    try:
        on_cordon = OnCordon(spec.get("onCordon") or OnCordon.MOVE)
    except ValueError:
        on_cordon = OnCordon.MOVE
    try:
        compaction = CompactionPolicy(spec.get("compaction") or CompactionPolicy.ALLOWED)
    except ValueError:
        compaction = CompactionPolicy.NEVER  # a value the schema would refuse: never move what we cannot read
    return GPUClassView(
        name=name,
        mode=mode,
        resource_name=resource_name,
        vendor=as_str(spec.get("vendor")),
        model=as_str(spec.get("model")),
        profile=as_str(spec.get("profile")),
        memory=str(spec.get("memory") or ""),
        max_count=_int(spec.get("maxCount")),
        node_selector=_selector(spec.get("nodeSelector")),
        on_cordon=on_cordon,
        compaction=compaction,
        tolerations=_tolerations(spec.get("tolerations")),
        deleting=bool(meta.get("deletionTimestamp")),
        dra=_dra_source(as_map(spec.get("source")).get("dra")),
        idle_hold_limit=_duration(spec.get("idleHoldLimit"), "spec.idleHoldLimit"),
        idle_hold_warning=_duration(spec.get("idleHoldWarning"), "spec.idleHoldWarning") or timedelta(0),
    )


def _duration(value: object, field: str) -> timedelta | None:
    """A Go-style duration of the spec (``720h``); None when unset. A value the schema would refuse makes the
    class unreadable (its holds then never expire by a rule nobody can read)."""
    if value is None or value == "":
        return None
    try:
        seconds = parse_duration(as_str(value))
    except ValueError:
        raise InvalidObject(f"{field} {value!r} is not a duration such as 720h or 30m") from None
    if seconds <= 0:
        raise InvalidObject(f"{field} {value!r} must be positive")
    return timedelta(seconds=seconds)


def _dra_source(value: object) -> DraSource | None:
    """``spec.source.dra``; None when the class's units come from device plugins."""
    if not _is_map(value):
        return None
    device_class = as_str(value.get("deviceClassName"))
    if not device_class:
        raise InvalidObject("spec.source.dra needs deviceClassName")
    selectors = tuple(as_str(as_map(as_map(selector).get("cel")).get("expression"))
                      for selector in _list(value.get("selectors")))
    if any(not expression for expression in selectors):
        raise InvalidObject("spec.source.dra.selectors: each selector needs cel.expression")
    return DraSource(device_class=device_class, selectors=selectors,
                     match_attribute=as_str(value.get("matchAttribute")))


def device_view(obj: Obj) -> DeviceView:
    # The hottest converter (every GPUDevice, every build): plain lookups, and
    # the helpers inlined for what the cache holds (dicts and strs); anything
    # else still goes through them, so every shape reads as before.
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = as_map(meta)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        spec = as_map(spec)
    status = obj.get("status")
    if not isinstance(status, dict):
        status = as_map(status)
    count = spec.get("count")
    class_name = spec.get("className")
    if type(count) is not int or type(class_name) is not str or not class_name:
        raise InvalidObject("a GPUDevice needs spec.className and an integer spec.count")
    attachment = None
    raw_attachment = status.get("attachment")
    if raw_attachment is not None and _is_map(raw_attachment) and raw_attachment.get("vmi"):
        attachment = Attachment(
            vmi=as_str(raw_attachment.get("vmi")),
            uid=as_str(raw_attachment.get("uid")),
            attached_at=parse_time(raw_attachment.get("attachedAt")),
            request_id=as_str(raw_attachment.get("requestId")),
        )
    request = None
    raw_request = status.get("bindRequest")
    if raw_request is not None and _is_map(raw_request) and raw_request.get("id"):
        request = BindRequest(
            id=as_str(raw_request.get("id")), vmi=as_str(raw_request.get("vmi")),
            time=parse_time(raw_request.get("time")),
        )
    answer = None
    raw_answer = status.get("bindAnswer")
    if raw_answer is not None and _is_map(raw_answer) and raw_answer.get("id"):
        answer = BindAnswer(
            id=as_str(raw_answer.get("id")),
            result=as_str(raw_answer.get("result")),
            reason=as_str(raw_answer.get("reason")),
            message=as_str(raw_answer.get("message")),
            node=as_str(raw_answer.get("node")),
            time=parse_time(raw_answer.get("time")),
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
        created=parse_time(meta.get("creationTimestamp")),
        ledger=_ledger(status) if "heldSince" in status else _NO_LEDGER,
    )


_NO_LEDGER: Final = Ledger()


def _ledger(status: Mapping[str, Any]) -> Ledger:
    """``status.heldSince``, ``idleSince`` and ``idleSeconds`` (R-LEDGER-1); an unreadable time reads as unset."""
    idle = status.get("idleSeconds")
    seconds = float(idle) if isinstance(idle, int | float) and not isinstance(idle, bool) and idle >= 0 else 0.0
    return Ledger(held_since=parse_time(status.get("heldSince")), idle_since=parse_time(status.get("idleSince")),
                  idle_seconds=seconds)


def node_inventory(obj: Obj) -> NodeInventory:
    meta = as_map(obj.get("metadata"))
    status = as_map(obj.get("status"))
    entries: list[tuple[str, int]] = []
    for device in _list(status.get("devices")):
        if _is_map(device):
            name, allocatable = device.get("resourceName"), device.get("allocatable")
            if type(allocatable) is not int:
                allocatable = _int(allocatable) or 0
            entries.append((name if type(name) is str else "", allocatable))
    agent = as_map(status.get("agent"))
    return NodeInventory(
        name=as_str(meta.get("name")),
        served=served_units(entries),
        resource_names=frozenset(n for n in _list(status.get("resourceNames")) if isinstance(n, str) and n),
        last_report=parse_time(agent.get("lastReport")),
    )


def node_view(obj: Obj) -> NodeView:
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    ready = False
    for condition in _list(as_map(obj.get("status")).get("conditions")):
        if _is_map(condition) and condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
    taints = tuple(
        Taint(key=as_str(t.get("key")), value=as_str(t.get("value")), effect=as_str(t.get("effect")))
        for t in _list(spec.get("taints"))
        if _is_map(t)
    )
    return NodeView(
        name=as_str(meta.get("name")),
        labels=as_map(meta.get("labels")),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        taints=taints,
    )


def _extended(section: Mapping[str, Any]) -> Mapping[str, Any]:
    return {k: v for k, v in section.items() if "/" in k}


def _requests(container: Mapping[str, Any], *, extended_only: bool) -> dict[str, Any]:
    resources = as_map(container.get("resources"))
    requests, limits = as_map(resources.get("requests")), as_map(resources.get("limits"))
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
    overhead, pod_level = as_map(spec.get("overhead")), as_map(as_map(spec.get("resources")).get("requests"))
    if extended_only:
        overhead, pod_level = _extended(overhead), EMPTY_OBJECT
    return PodResources(
        containers=containers,
        init_containers=inits,
        overhead=container_requests(overhead, EMPTY_OBJECT),
        pod_level=container_requests(pod_level, EMPTY_OBJECT),
    )


def asks_extended(spec: Mapping[str, Any]) -> bool:
    """Whether a pod spec requests or limits an extended resource (``domain/name``) in any container."""
    for field in ("containers", "initContainers"):
        for container in _list(spec.get(field)):
            if not _is_map(container):
                continue
            resources = as_map(container.get("resources"))
            for section in ("requests", "limits"):
                if any("/" in name for name in as_map(resources.get(section))):
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
        resources = as_map(container.get("resources"))
        merged: dict[str, int] = {}
        for section in (as_map(resources.get("limits")), as_map(resources.get("requests"))):  # a request wins
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
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    status = as_map(obj.get("status"))
    requests = _plain_requests(spec)
    if requests is None:
        requests = whole_requests(pod_requests(pod_resources(spec, extended_only=True))) if asks_extended(spec) else {}
    return PodView(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        uid=as_str(meta.get("uid")),
        node_name=as_str(spec.get("nodeName")) or None,
        phase=_POD_PHASES.get(as_str(status.get("phase")), PodPhase.PENDING),
        requests=requests,
        claims_vmi=_claimed_vmi(meta.get("ownerReferences")),
        created=parse_time(meta.get("creationTimestamp")),
    )


def _claimed_vmi(owners: object) -> tuple[str, str] | None:
    """The (name, UID) of a controller ownerReference to a KubeVirt VMI: what the pod claims to launch."""
    for owner in _list(owners):
        if (isinstance(owner, Mapping) and owner.get("controller") is True
                and owner.get("kind") == "VirtualMachineInstance"
                and as_str(owner.get("apiVersion")).startswith("kubevirt.io/")):
            return as_str(owner.get("name")), as_str(owner.get("uid"))
    return None


def vmi_view(obj: Obj) -> VMIView:
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    status = as_map(obj.get("status"))
    return VMIView(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        uid=as_str(meta.get("uid")),
        phase=as_str(status.get("phase")),
        node_name=as_str(status.get("nodeName")) or None,
        active_pods=frozenset(map(str, as_map(status.get("activePods")))),
        tolerations=_tolerations(spec.get("tolerations")),
        node_selector={str(k): str(v) for k, v in as_map(spec.get("nodeSelector")).items()},
        node_affinity=_required_node_affinity(spec.get("affinity")),
    )


def _requirements(items: object) -> tuple[SelectorRequirement, ...]:
    return tuple(
        SelectorRequirement(
            key=as_str(e.get("key")),
            operator=as_str(e.get("operator")),
            values=tuple(str(v) for v in _list(e.get("values"))),
        )
        for e in _list(items)
        if _is_map(e)
    )


def _required_node_affinity(affinity: object) -> tuple[NodeSelectorTerm, ...] | None:
    """``nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``; None when not set."""
    node_affinity = as_map(as_map(affinity).get("nodeAffinity"))
    required = as_map(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
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
    meta = as_map(obj.get("metadata"))
    return NamespaceView(name=as_str(meta.get("name")), labels=as_map(meta.get("labels")))


def permitted_host_devices(kubevirts: Iterable[Obj]) -> PermittedHostDevices | None:
    """The union of ``permittedHostDevices`` over KubeVirt CRs; None when none configures the table."""
    pci: list[PciHostDevice] = []
    mediated: list[MediatedDevice] = []
    configured = False
    for obj in kubevirts:
        table = as_map(as_map(obj.get("spec")).get("configuration")).get("permittedHostDevices")
        if not _is_map(table):
            continue
        configured = True
        for entry in _list(table.get("pciHostDevices")):
            if _is_map(entry):
                pci.append(
                    PciHostDevice(
                        selector=as_str(entry.get("pciVendorSelector")), resource_name=as_str(entry.get("resourceName"))
                    )
                )
        for entry in _list(table.get("mediatedDevices")):
            if _is_map(entry):
                mediated.append(
                    MediatedDevice(
                        selector=as_str(entry.get("mdevNameSelector")), resource_name=as_str(entry.get("resourceName"))
                    )
                )
    return PermittedHostDevices(pci=tuple(pci), mediated=tuple(mediated)) if configured else None


def tenant_quotas(quotas: Iterable[Obj]) -> dict[str, Mapping[str, Any]]:
    """Namespace -> ``spec.hard`` of its ``tenant-quota`` ResourceQuota."""
    found: dict[str, Mapping[str, Any]] = {}
    for obj in quotas:
        meta = as_map(obj.get("metadata"))
        if meta.get("name") == keys.TENANT_QUOTA_NAME:
            found[as_str(meta.get("namespace"))] = as_map(as_map(obj.get("spec")).get("hard"))
    return found


def resource_slice_view(obj: Obj) -> SliceView:
    """A ResourceSlice (``resource.k8s.io/v1``): its pool, node and devices; a device whose attributes or
    capacity cannot be read is kept with why (a selector cannot match it, as in the allocator)."""
    meta, spec = as_map(obj.get("metadata")), as_map(obj.get("spec"))
    driver, pool = as_str(spec.get("driver")), as_map(spec.get("pool"))
    if not driver or not as_str(pool.get("name")):
        raise InvalidObject("a ResourceSlice needs spec.driver and spec.pool.name")
    devices: list[SliceDevice] = []
    for device in _list(spec.get("devices")):
        if not _is_map(device) or not as_str(device.get("name")):
            continue
        taint = next((f"{as_str(t.get('key'))}={as_str(t.get('value'))}:{t.get('effect')}"
                      for t in _list(device.get("taints")) if _is_map(t)
                      and t.get("effect") in ("NoSchedule", "NoExecute")), "")
        try:
            devices.append(SliceDevice(name=device["name"], attrs=DeviceAttrs.from_slice_device(driver, device),
                                       taint=taint))
        except CelError as error:
            devices.append(SliceDevice(name=device["name"], attrs=None, problem=str(error), taint=taint))
    return SliceView(name=as_str(meta.get("name")), driver=driver, pool=as_str(pool.get("name")),
                     generation=_int(pool.get("generation")) or 0,
                     slice_count=_int(pool.get("resourceSliceCount")) or 1,
                     node=as_str(spec.get("nodeName")), devices=tuple(devices))


def device_taint_rule_view(obj: Obj) -> TaintRule | None:
    """A DeviceTaintRule (``resource.k8s.io/v1``, 1.37): None when it keeps nothing off its devices (effect
    ``None``, or no selector: a rule without one selects no device)."""
    meta, spec = as_map(obj.get("metadata")), as_map(obj.get("spec"))
    taint, selector = as_map(spec.get("taint")), spec.get("deviceSelector")
    if taint.get("effect") not in ("NoSchedule", "NoExecute") or not _is_map(selector):
        return None

    def field(name: str) -> str | None:
        value = selector.get(name)
        return value if isinstance(value, str) else None

    return TaintRule(name=as_str(meta.get("name")),
                     taint=f"{as_str(taint.get('key'))}={as_str(taint.get('value'))}:{taint.get('effect')}",
                     driver=field("driver"), pool=field("pool"), device=field("device"))


def device_class_selectors(obj: Obj) -> tuple[str, ...]:
    """A DeviceClass's CEL selectors (``spec.selectors[].cel.expression``), in order; a selector of another
    kind is refused (the allocator would not know it either)."""
    out: list[str] = []
    for at, selector in enumerate(_list(as_map(obj.get("spec")).get("selectors"))):
        expression = as_map(as_map(selector).get("cel")).get("expression")
        if not isinstance(expression, str):
            raise InvalidObject(f"selector {at} of the DeviceClass has no cel.expression")
        out.append(expression)
    return tuple(out)


def resource_claim_view(obj: Obj) -> ClaimView:
    """A ResourceClaim: the devices its allocation holds, the allocation's node, and the GPUDevice that
    owns it (its controller reference of our group), if one does."""
    meta, status = as_map(obj.get("metadata")), as_map(obj.get("status"))
    allocation = as_map(status.get("allocation"))
    allocated = tuple(
        DeviceRef(as_str(result.get("driver")), as_str(result.get("pool")), as_str(result.get("device")))
        for result in _list(as_map(allocation.get("devices")).get("results")) if _is_map(result))
    names = {value for term in _list(as_map(allocation.get("nodeSelector")).get("nodeSelectorTerms"))
             if _is_map(term) for field in _list(term.get("matchFields"))
             if _is_map(field) and field.get("key") == "metadata.name" and field.get("operator") == "In"
             for value in _list(field.get("values")) if isinstance(value, str)}
    holder = next((as_str(ref.get("name")) for ref in _list(meta.get("ownerReferences"))
                   if _is_map(ref) and ref.get("controller") is True and ref.get("kind") == keys.GPUDEVICE_KIND
                   and ref.get("apiVersion") == keys.API_VERSION), "")
    return ClaimView(namespace=as_str(meta.get("namespace")), name=as_str(meta.get("name")), allocated=allocated,
                     node=next(iter(names)) if len(names) == 1 else "", holder=holder)
