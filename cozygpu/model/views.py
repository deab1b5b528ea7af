"""The typed views of cluster objects a decision reads: GPU classes, devices, Nodes and their reports,
pods, VMIs, namespaces, KubeVirt's permitted devices, budgets and usage.

Contract: views hold only the fields decisions need, already parsed (enums, ints, datetimes); nothing here
reads JSON (``cozygpu.views.decode`` does). Everything is frozen; mapping fields are read-only by
convention.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime, timedelta

import attrs

#: A namespaced object's key: (namespace, name).
DeviceKey = tuple[str, str]
VmiKey = tuple[str, str]


class Phase(enum.StrEnum):
    """GPUDevice ``status.phase``; an unset phase reads as Pending."""

    PENDING = "Pending"
    BOUND = "Bound"
    LOST = "Lost"
    #: Its hold expired after sitting idle past its class's ``idleHoldLimit`` (R-LEDGER-2): it holds nothing,
    #: counts against no budget and is never placed again; it stays for the tenant to read or delete. The read
    #: model leaves it out.
    RELEASED = "Released"


# Enum members read through the class are slow on hot paths; these are the same objects.
_PENDING = Phase.PENDING
_BOUND = Phase.BOUND


class Mode(enum.StrEnum):
    PASSTHROUGH = "Passthrough"
    VGPU = "VGPU"


class OnCordon(enum.StrEnum):
    MOVE = "Move"
    STAY = "Stay"


class CompactionPolicy(enum.StrEnum):
    """Whether the binder may move a class's stopped holds to make room for a large order (R-BIND-11)."""

    ALLOWED = "Allowed"
    NEVER = "Never"


class PodPhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


#: Pods in these phases count nowhere (the scheduler and kubelet skip them).
FINAL_POD_PHASES = frozenset({PodPhase.SUCCEEDED, PodPhase.FAILED})


@attrs.frozen(kw_only=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


@attrs.frozen(kw_only=True)
class Taint:
    key: str
    value: str = ""
    effect: str


@attrs.frozen(kw_only=True)
class SelectorRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class LabelSelector:
    """A Kubernetes label selector: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[SelectorRequirement, ...] = ()


@attrs.frozen(kw_only=True)
class NodeSelectorTerm:
    """One term of a required node affinity: its label requirements and its field requirements, ANDed.

    Terms are ORed; a term with neither matches no node (core/v1 ``NodeSelectorTerm``).
    """

    match_expressions: tuple[SelectorRequirement, ...] = ()
    match_fields: tuple[SelectorRequirement, ...] = ()


@attrs.frozen(kw_only=True)
class DraSource:
    """``spec.source.dra`` (SPEC §1.5): a unit is a ResourceSlice device its DeviceClass and selectors match."""

    device_class: str
    #: CEL expressions, each of which a device must match (beside the DeviceClass's own).
    selectors: tuple[str, ...] = ()
    #: ``matchAttribute``: a multi-GPU set's devices share this attribute's value (empty: no constraint).
    match_attribute: str = ""


@attrs.frozen(kw_only=True)
class GPUClassView:
    """A hoster's offer (GPUClass, SPEC 1.1). ``max_count`` is the spec value, unresolved (R-MOD-11)."""

    name: str
    mode: Mode
    resource_name: str
    vendor: str = ""
    model: str = ""
    profile: str = ""
    memory: str = ""
    max_count: int | None = None
    node_selector: LabelSelector | None = None
    on_cordon: OnCordon = OnCordon.MOVE
    compaction: CompactionPolicy = CompactionPolicy.ALLOWED
    #: Tolerations of the class's launcher pods (``spec.tolerations``; empty when unset).
    tolerations: tuple[Toleration, ...] = ()
    deleting: bool = False
    #: Set for a DRA-sourced class; None for device-plugin units (``source.devicePlugin``).
    dra: DraSource | None = None
    #: ``spec.idleHoldLimit``: a hold idle this long is released (R-LEDGER-2); None: holds never expire.
    idle_hold_limit: timedelta | None = None
    #: ``spec.idleHoldWarning``: how long before the release the hold is warned (zero: no warning).
    idle_hold_warning: timedelta = timedelta(0)


@attrs.frozen(kw_only=True)
class Ledger:
    """What a hold's status says of its time (R-LEDGER-1): since when its units are held (``heldSince``), since
    when no running VM uses them (``idleSince``, None while one does), and the seconds of its earlier idle
    periods (``idleSeconds``). The binder writes them; every figure of the ledger is derived from them."""

    held_since: datetime | None = None
    idle_since: datetime | None = None
    idle_seconds: float = 0.0


@attrs.frozen(kw_only=True)
class Attachment:
    """``status.attachment``: the VMI (namespace-local name) the device is attached to."""

    vmi: str
    uid: str = ""
    attached_at: datetime | None = None
    request_id: str = ""


@attrs.frozen(kw_only=True)
class BindRequest:
    id: str
    vmi: str = ""
    time: datetime | None = None


@attrs.frozen(kw_only=True)
class BindAnswer:
    id: str
    result: str = ""
    reason: str = ""
    message: str = ""
    node: str = ""
    time: datetime | None = None


@attrs.frozen(kw_only=True)
class DeviceView:
    """A tenant's order and hold (GPUDevice, SPEC 1.2)."""

    namespace: str
    name: str
    class_name: str
    count: int
    phase: Phase = Phase.PENDING
    node_name: str | None = None
    uid: str = ""
    attachment: Attachment | None = None
    bind_request: BindRequest | None = None
    bind_answer: BindAnswer | None = None
    template: bool = False
    deleting: bool = False
    #: ``metadata.creationTimestamp``: new orders are placed oldest first.
    created: datetime | None = None
    ledger: Ledger = Ledger()

    @property
    def key(self) -> DeviceKey:
        return (self.namespace, self.name)

    @property
    def accepted(self) -> bool:
        """The binder accepted the order: it counts against budgets from now on (R-MOD-4)."""
        return self.phase is not _PENDING

    @property
    def holds_units(self) -> bool:
        """Bound on a node: the only state that takes units from a node (R-MOD-6, R-MOD-7)."""
        return self.phase is _BOUND and bool(self.node_name)

    @property
    def vmi_key(self) -> VmiKey | None:
        return (self.namespace, self.attachment.vmi) if self.attachment is not None else None

    @property
    def unanswered_request(self) -> bool:
        request = self.bind_request
        if request is None or not request.id:
            return False
        return self.bind_answer is None or self.bind_answer.id != request.id


@attrs.frozen(kw_only=True)
class NodeView:
    """What eligibility reads from a Node (R-MOD-8)."""

    name: str
    labels: Mapping[str, str] = attrs.field(factory=dict)
    unschedulable: bool = False
    ready: bool = True
    taints: tuple[Taint, ...] = ()


@attrs.frozen(kw_only=True)
class NodeInventory:
    """A GPUNode's report: units served per resource name, counted once (R-MOD-7)."""

    name: str
    served: Mapping[str, int] = attrs.field(factory=dict)
    resource_names: frozenset[str] = frozenset()
    last_report: datetime | None = None
    #: Set by the derivation from ``now``: a stale or missing report is unknown, never free.
    fresh: bool = True


@attrs.frozen(kw_only=True)
class PodView:
    """A pod's GPU requests with the scheduler's arithmetic already applied (R-MOD-4)."""

    namespace: str
    name: str
    uid: str
    node_name: str | None = None
    phase: PodPhase = PodPhase.PENDING
    #: Effective requests of extended resources, whole units (see ``pods.pod_requests``).
    requests: Mapping[str, int] = attrs.field(factory=dict)
    #: The VMI (name, UID) of the pod's controller ownerReference: what the pod *claims* to launch.
    #: Anyone who creates a pod can write it; it is never proof (R-MOD-5), only R-MOD-7's launcher window.
    claims_vmi: tuple[str, str] | None = None
    #: ``metadata.creationTimestamp``: the launcher window runs from it.
    created: datetime | None = None

    @property
    def final(self) -> bool:
        return self.phase in FINAL_POD_PHASES


@attrs.frozen(kw_only=True)
class VMIView:
    namespace: str
    name: str
    uid: str = ""
    phase: str = ""
    node_name: str | None = None
    #: ``status.activePods`` keys: the only proof that a pod is this VMI's launcher (R-MOD-5).
    active_pods: frozenset[str] = frozenset()
    tolerations: tuple[Toleration, ...] = ()
    node_selector: Mapping[str, str] = attrs.field(factory=dict)
    #: ``spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``,
    #: None when the VMI has no required node affinity (every node passes).
    node_affinity: tuple[NodeSelectorTerm, ...] | None = None

    @property
    def key(self) -> VmiKey:
        return (self.namespace, self.name)


@attrs.frozen(kw_only=True)
class NamespaceView:
    name: str
    labels: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class PciHostDevice:
    selector: str
    resource_name: str


@attrs.frozen(kw_only=True)
class MediatedDevice:
    selector: str
    resource_name: str


@attrs.frozen(kw_only=True)
class PermittedHostDevices:
    """KubeVirt's ``spec.configuration.permittedHostDevices`` (PCI and mediated entries; USB is not a GPU)."""

    pci: tuple[PciHostDevice, ...] = ()
    mediated: tuple[MediatedDevice, ...] = ()


# ---------------------------------------------------------------------------
# Derived records (computed by ``cozygpu.model.derive``).


@attrs.frozen(kw_only=True)
class BudgetValue:
    """One declared budget. ``amount`` is None when the value cannot be read: such a budget refuses."""

    key: str
    text: str
    amount: int | None
    problem: str = ""


@attrs.frozen(kw_only=True)
class TenantBudgets:
    """The GPU budgets one tenant declares in ``tenant-quota`` (R-MOD-2, R-MOD-3)."""

    namespace: str
    per_class: Mapping[str, BudgetValue] = attrs.field(factory=dict)
    total: BudgetValue | None = None
    #: Raw keys by the GPU resource name they name.
    raw: Mapping[str, BudgetValue] = attrs.field(factory=dict)

    @property
    def declares_gpu_key(self) -> bool:
        """A class or total key: from then on the tenant's raw keys cap instead of blocking."""
        return self.total is not None or bool(self.per_class)


@attrs.frozen(kw_only=True)
class Usage:
    """GPU units counted against budgets: per class, total, and per raw resource name."""

    per_class: Mapping[str, int] = attrs.field(factory=dict)
    total: int = 0
    raw: Mapping[str, int] = attrs.field(factory=dict)


EMPTY_USAGE = Usage()
