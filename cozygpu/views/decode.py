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
    NodeView,
    OnCordon,
    PciHostDevice,
    PermittedHostDevices,
    Phase,
    SelectorRequirement,
    Taint,
    Toleration,
)

Obj = Mapping[str, Any]

EMPTY_OBJECT: Mapping[str, Any] = {}
_PHASES = {p.value: p for p in Phase}
_PENDING = Phase.PENDING


class InvalidObject(ValueError):
    """An object the snapshot cannot use."""


def is_map(value: object) -> TypeGuard[Mapping[str, Any]]:
    # dict first and None next: the cache's objects are dicts, a missing field
    # is None, and the Mapping ABC check is slow for everything else.
    if isinstance(value, dict):
        return True
    return value is not None and isinstance(value, Mapping)


def as_map(value: object) -> Mapping[str, Any]:
    return value if is_map(value) else EMPTY_OBJECT


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: object) -> str:
    return value if type(value) is str else ""


def as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tolerations(items: object) -> tuple[Toleration, ...]:
    if not items:  # the common case: none set
        return ()
    return tuple(
        Toleration(
            key=as_str(t.get("key")),
            operator=as_str(t.get("operator")) or "Equal",
            value=as_str(t.get("value")),
            effect=as_str(t.get("effect")),
        )
        for t in as_list(items)
        if is_map(t)
    )


def requirements(items: object) -> tuple[SelectorRequirement, ...]:
    return tuple(
        SelectorRequirement(
            key=as_str(e.get("key")),
            operator=as_str(e.get("operator")),
            values=tuple(str(v) for v in as_list(e.get("values"))),
        )
        for e in as_list(items)
        if is_map(e)
    )


def _selector(value: object) -> LabelSelector | None:
    if not is_map(value):
        return None
    labels = tuple(sorted((str(k), str(v)) for k, v in as_map(value.get("matchLabels")).items()))
    return LabelSelector(match_labels=labels, match_expressions=requirements(value.get("matchExpressions")))


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
        max_count=as_int(spec.get("maxCount")),
        node_selector=_selector(spec.get("nodeSelector")),
        on_cordon=on_cordon,
        compaction=compaction,
        tolerations=tolerations(spec.get("tolerations")),
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
    if not is_map(value):
        return None
    device_class = as_str(value.get("deviceClassName"))
    if not device_class:
        raise InvalidObject("spec.source.dra needs deviceClassName")
    selectors = tuple(as_str(as_map(as_map(selector).get("cel")).get("expression"))
                      for selector in as_list(value.get("selectors")))
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
    if raw_attachment is not None and is_map(raw_attachment) and raw_attachment.get("vmi"):
        attachment = Attachment(
            vmi=as_str(raw_attachment.get("vmi")),
            uid=as_str(raw_attachment.get("uid")),
            attached_at=parse_time(raw_attachment.get("attachedAt")),
            request_id=as_str(raw_attachment.get("requestId")),
        )
    request = None
    raw_request = status.get("bindRequest")
    if raw_request is not None and is_map(raw_request) and raw_request.get("id"):
        request = BindRequest(
            id=as_str(raw_request.get("id")), vmi=as_str(raw_request.get("vmi")),
            time=parse_time(raw_request.get("time")),
        )
    answer = None
    raw_answer = status.get("bindAnswer")
    if raw_answer is not None and is_map(raw_answer) and raw_answer.get("id"):
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
        template=labels is not None and is_map(labels) and keys.TEMPLATE_DEVICE_LABEL in labels,
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
    for device in as_list(status.get("devices")):
        if is_map(device):
            name, allocatable = device.get("resourceName"), device.get("allocatable")
            if type(allocatable) is not int:
                allocatable = as_int(allocatable) or 0
            entries.append((name if type(name) is str else "", allocatable))
    agent = as_map(status.get("agent"))
    return NodeInventory(
        name=as_str(meta.get("name")),
        served=served_units(entries),
        resource_names=frozenset(n for n in as_list(status.get("resourceNames")) if isinstance(n, str) and n),
        last_report=parse_time(agent.get("lastReport")),
    )


def node_view(obj: Obj) -> NodeView:
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    ready = False
    for condition in as_list(as_map(obj.get("status")).get("conditions")):
        if is_map(condition) and condition.get("type") == "Ready":
            ready = condition.get("status") == "True"
    taints = tuple(
        Taint(key=as_str(t.get("key")), value=as_str(t.get("value")), effect=as_str(t.get("effect")))
        for t in as_list(spec.get("taints"))
        if is_map(t)
    )
    return NodeView(
        name=as_str(meta.get("name")),
        labels=as_map(meta.get("labels")),
        unschedulable=bool(spec.get("unschedulable")),
        ready=ready,
        taints=taints,
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
        if not is_map(table):
            continue
        configured = True
        for entry in as_list(table.get("pciHostDevices")):
            if is_map(entry):
                pci.append(
                    PciHostDevice(
                        selector=as_str(entry.get("pciVendorSelector")), resource_name=as_str(entry.get("resourceName"))
                    )
                )
        for entry in as_list(table.get("mediatedDevices")):
            if is_map(entry):
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


