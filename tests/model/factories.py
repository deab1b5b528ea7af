"""Factories of model views and snapshots for the model's tests: short to call, explicit defaults."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from cozygpu.model.derive import derive_snapshot
from cozygpu.model.snapshot import (
    Attachment,
    BindRequest,
    DeviceView,
    GPUClassView,
    LabelSelector,
    Mode,
    NamespaceView,
    NodeInventory,
    NodeSelectorTerm,
    NodeView,
    OnCordon,
    PermittedHostDevices,
    Phase,
    PodPhase,
    PodView,
    Snapshot,
    Taint,
    Toleration,
    VMIView,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
H100 = "nvidia.com/GH100_H100_SXM5_80GB"
A10_Q = "nvidia.com/A10-24Q"


def gpu_class(
    name: str = "h100",
    *,
    resource: str = H100,
    mode: Mode = Mode.PASSTHROUGH,
    max_count: int | None = None,
    on_cordon: OnCordon = OnCordon.MOVE,
    selector: LabelSelector | None = None,
    tolerations: tuple[Toleration, ...] = (),
    deleting: bool = False,
) -> GPUClassView:
    return GPUClassView(
        name=name,
        mode=mode,
        resource_name=resource,
        max_count=max_count,
        on_cordon=on_cordon,
        node_selector=selector,
        tolerations=tolerations,
        deleting=deleting,
    )


def device(
    name: str,
    *,
    namespace: str = "tenant-a",
    cls: str = "h100",
    count: int = 1,
    phase: Phase = Phase.PENDING,
    node: str | None = None,
    vmi: str | None = None,
    vmi_uid: str = "",
    request: str | None = None,
    created: datetime | None = None,
) -> DeviceView:
    return DeviceView(
        namespace=namespace,
        name=name,
        class_name=cls,
        count=count,
        phase=phase,
        node_name=node,
        attachment=Attachment(vmi=vmi, uid=vmi_uid) if vmi else None,
        bind_request=BindRequest(id=request, vmi=vmi or "") if request else None,
        created=created,
    )


def node(
    name: str,
    *,
    ready: bool = True,
    unschedulable: bool = False,
    taints: tuple[Taint, ...] = (),
    labels: Mapping[str, str] | None = None,
) -> NodeView:
    return NodeView(name=name, ready=ready, unschedulable=unschedulable, taints=taints, labels=dict(labels or {}))


def inventory(
    name: str, served: Mapping[str, int] | None = None, *, last_report: datetime | None = NOW
) -> NodeInventory:
    served = dict(served if served is not None else {H100: 8})
    return NodeInventory(name=name, served=served, resource_names=frozenset(served), last_report=last_report)


def gpu_nodes(*specs: tuple[str, int], resource: str = H100) -> tuple[list[NodeView], list[NodeInventory]]:
    """Ready, schedulable nodes each serving ``units`` of ``resource``."""
    return [node(n) for n, _ in specs], [inventory(n, {resource: units}) for n, units in specs]


def pod(
    name: str,
    *,
    namespace: str = "tenant-a",
    uid: str | None = None,
    node_name: str | None = "n1",
    requests: Mapping[str, int] | None = None,
    phase: PodPhase = PodPhase.RUNNING,
    claims_vmi: tuple[str, str] | None = None,
    created: datetime | None = None,
) -> PodView:
    return PodView(
        namespace=namespace,
        name=name,
        uid=uid or f"uid-{name}",
        node_name=node_name,
        phase=phase,
        requests=dict(requests or {}),
        claims_vmi=claims_vmi,
        created=created,
    )


def vmi(
    name: str,
    *,
    namespace: str = "tenant-a",
    uid: str = "",
    active: Iterable[str] = (),
    tolerations: tuple[Toleration, ...] = (),
    node_selector: Mapping[str, str] | None = None,
    node_affinity: tuple[NodeSelectorTerm, ...] | None = None,
) -> VMIView:
    return VMIView(
        namespace=namespace,
        name=name,
        uid=uid,
        active_pods=frozenset(active),
        tolerations=tolerations,
        node_selector=dict(node_selector or {}),
        node_affinity=node_affinity,
    )


def namespaces(*names: str, entitled: Iterable[str] = ()) -> list[NamespaceView]:
    marked = set(entitled)
    return [
        NamespaceView(name=n, labels={"gpu.cozystack.io/vgpu-entitled": "true"} if n in marked else {}) for n in names
    ]


def snapshot(
    *,
    classes: Iterable[GPUClassView] | None = None,
    devices: Iterable[DeviceView] = (),
    nodes: Iterable[NodeView] | None = None,
    inventories: Iterable[NodeInventory] | None = None,
    pods: Iterable[PodView] = (),
    vmis: Iterable[VMIView] = (),
    namespaces_: Iterable[NamespaceView] = (),
    quotas: Mapping[str, Mapping[str, object]] | None = None,
    permitted: PermittedHostDevices | None = None,
    hoster_names: Iterable[str] = (),
    now: datetime = NOW,
) -> Snapshot:
    """A snapshot; by default one class ``h100`` and one node ``n1`` serving 8 of it."""
    if nodes is None and inventories is None:
        node_views, inventory_views = gpu_nodes(("n1", 8))
    else:
        node_views, inventory_views = list(nodes or ()), list(inventories or ())
    return derive_snapshot(
        now=now,
        classes=list(classes) if classes is not None else [gpu_class()],
        devices=devices,
        nodes=node_views,
        inventories=inventory_views,
        pods=pods,
        vmis=vmis,
        namespaces=namespaces_,
        quotas=quotas,
        permitted=permitted,
        hoster_names=hoster_names,
    )
