"""The typed snapshot every decision reads: views of the cluster objects, and indexes over them.

Why: the binder, the webhooks, the catalog and the CLI each hold their own
cache. Each turns it into this one shape (the builder sits beside the cache,
``cozygpu.views.live``) and asks the same model functions, so their
answers cannot drift apart.

Contract:
- Views hold only the fields decisions need, already parsed (enums, ints,
  datetimes); nothing here reads JSON.
- Everything is frozen. Mapping fields are read-only by convention: never
  mutate what a snapshot hands out.
- A :class:`Snapshot` is made by :func:`cozygpu.model.derive.derive_snapshot`,
  which also computes the indexes (devices by node, class, namespace and
  VMI; the tenant tree; subtree usage; per-node capacity; per-class
  availability), so that a catalog query costs O(ancestry x classes) and
  not O(all devices).
- Time is a value: the snapshot carries the ``now`` it was derived at.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TypeVar

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


@attrs.frozen(kw_only=True)
class NodeCapacity:
    """One node and one resource name (R-MOD-7). ``free`` may be negative when capacity was lost."""

    node: str
    resource_name: str
    served: int
    held: int
    raw_in_use: int
    fresh: bool = True
    #: Units that claimed launchers use while their window runs (R-MOD-7): no new order is booked onto
    #: them, but they are not capacity lost: no held set leaves the node for them.
    window: int = 0

    @property
    def free(self) -> int:
        """Served minus held minus raw use: below zero, capacity was lost (the window is not counted)."""
        return self.served - self.held - self.raw_in_use

    @property
    def room(self) -> int:
        """What a new booking may take (may be negative): ``free`` less the launcher window's units."""
        return self.free - self.window


@attrs.frozen(kw_only=True)
class ClassAvailability:
    """Free units of one class over the nodes eligible for it (class tolerations and nodeSelector only)."""

    class_name: str
    #: Eligible nodes with a fresh report serving the class's resource name, with their free units.
    node_free: Mapping[str, int] = attrs.field(factory=dict)
    free_in_cluster: int = 0
    #: Units the eligible nodes of ``node_free`` serve in all (the class's size, for its report).
    served_in_cluster: int = 0
    free_on_best_node: int = 0
    best_node: str | None = None


@attrs.frozen
class Changes:
    """What the updates after some generation touched: the nodes, devices and VMIs to judge again."""

    nodes: frozenset[str]
    devices: frozenset[DeviceKey]
    vmis: frozenset[VmiKey]
    #: Resource names whose room (a node's free units for new bookings) or whose availability for a class
    #: changed: where a Pending or Lost set of that name may find room it did not have.
    names: frozenset[str] = frozenset()
    #: Whether some tenant subtree's usage changed (a budget may have room, or a refusal new numbers).
    usage: bool = False


class ChangeLog:
    """Which nodes, devices and VMIs a model's updates touched, newest last (kube-scheduler's generations).

    Why: a reader that decided on an earlier snapshot of the same model asks
    what changed since, at the cost of what changed, instead of comparing
    every node and device. Each key is in the log once, with the generation
    of its last touch; the log is shared by every snapshot of one model (a
    rebuild clears it and says so), so asking the newest snapshot about an
    old generation also names keys touched after the snapshot one holds: a
    superset, never less.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, int] = {}
        self.devices: dict[DeviceKey, int] = {}
        self.vmis: dict[VmiKey, int] = {}
        self.names: dict[str, int] = {}
        #: The last generation in which some tenant subtree's usage changed.
        self.usage = 0
        self._rebuilt = 0

    def rebuilt(self, generation: int) -> None:
        for log in (self.nodes, self.devices, self.vmis, self.names):
            log.clear()
        self._rebuilt = generation

    def since(self, generation: int) -> Changes | None:
        """The keys touched after ``generation``; None when the model was rebuilt since (everything changed)."""
        if generation < self._rebuilt:
            return None
        return Changes(nodes=_since(self.nodes, generation), devices=_since(self.devices, generation),
                       vmis=_since(self.vmis, generation), names=_since(self.names, generation),
                       usage=self.usage > generation)


_K = TypeVar("_K")


def touch(log: dict[_K, int], key: _K, generation: int) -> None:
    """Note that ``key`` changed in ``generation``: it moves to the newest end of its log."""
    log.pop(key, None)
    log[key] = generation


def _since(log: dict[_K, int], generation: int) -> frozenset[_K]:
    found: list[_K] = []
    for key in reversed(log):
        if log[key] <= generation:
            break
        found.append(key)
    return frozenset(found)


@attrs.frozen(kw_only=True)
class DraGroup:
    """One node's devices of a DRA offer with a ``matchAttribute`` that share its value (one PCIe root): how
    many are free, and the holds (by device key: a hold claim is named after its GPUDevice) whose claims
    hold devices of this group and of no other, which compaction may move whole to free it (R-BIND-11)."""

    value: str
    free: int
    holds: frozenset[DeviceKey]


@attrs.frozen(kw_only=True)
class Snapshot:
    """Everything a GPU decision reads, with indexes. Build it with ``derive_snapshot``."""

    now: datetime
    classes: Mapping[str, GPUClassView]
    devices: Mapping[DeviceKey, DeviceView]
    nodes: Mapping[str, NodeView]
    inventories: Mapping[str, NodeInventory]
    pods: Mapping[str, PodView]
    vmis: Mapping[VmiKey, VMIView]
    namespaces: Mapping[str, NamespaceView]
    budgets: Mapping[str, TenantBudgets]
    effective_names: frozenset[str]
    permitted: PermittedHostDevices | None
    # Indexes.
    devices_by_node: Mapping[str, tuple[DeviceKey, ...]] = attrs.field(factory=dict)
    devices_by_vmi: Mapping[VmiKey, tuple[DeviceKey, ...]] = attrs.field(factory=dict)
    #: Pod UID -> the VMI that lists it in ``status.activePods`` (R-MOD-5).
    launchers: Mapping[str, VmiKey] = attrs.field(factory=dict)
    #: Tenant namespace -> its direct children among known namespaces.
    children: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: DRA-sourced class name -> why it sells less than its slices hold (``model.dra.dra_offers``): its
    #: DeviceClass gone, a pool incomplete, a device tainted or unreadable, another class's offer used.
    dra_problems: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: Tenant namespace -> usage of its whole subtree (R-MOD-2, R-MOD-4).
    subtree_usage: Mapping[str, Usage] = attrs.field(factory=dict)
    #: Tenant namespace -> orders of its subtree not accepted yet (Pending, not deleting). They count
    #: for the admission check and the catalog (R-MOD-4), never for the binder, which accepts them.
    pending_usage: Mapping[str, Usage] = attrs.field(factory=dict)
    #: Node -> resource name -> capacity (R-MOD-7).
    capacity: Mapping[str, Mapping[str, NodeCapacity]] = attrs.field(factory=dict)
    #: Class -> availability over its eligible nodes (R-MOD-12).
    availability: Mapping[str, ClassAvailability] = attrs.field(factory=dict)
    #: Resource name -> nodes with a fresh report serving it, sorted by name.
    serving: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: When the first launcher window still open closes (R-MOD-7): the snapshot is true until then.
    window_closes: datetime | None = None
    #: Nodes with a fresh report serving less of some name than is held and used there (capacity lost).
    over_capacity: frozenset[str] = frozenset()
    #: Class -> units its Bound devices hold (a class's report reads it; no walk over its devices).
    held_by_class: Mapping[str, int] = attrs.field(factory=dict)
    #: Class -> (units, how many) of its stopped holds (Bound, attached to no VMI, no template, not deleting),
    #: by units: the largest bounds how few moves a compaction may need (R-BIND-11), none means none may move.
    stopped_hold_sizes: Mapping[str, tuple[tuple[int, int], ...]] = attrs.field(factory=dict)
    #: Resource name -> room -> the nodes (sorted by name) with a fresh report and that much room (> 0) for
    #: new bookings. The fullest node with room for n units (R-BIND-5) is the first node of the first bucket
    #: at or above n that may take the set: no walk over every node serving the name.
    rooms: Mapping[str, Mapping[int, tuple[str, ...]]] = attrs.field(factory=dict)
    #: Devices released after sitting idle (R-LEDGER-2): out of every other map, kept so a start naming one is
    #: told why rather than that it does not exist.
    released: Mapping[DeviceKey, DeviceView] = attrs.field(factory=dict)
    #: Node -> resource name -> its groups (``model.dra.node_groups``), for DRA offers with a ``matchAttribute``:
    #: the room a compaction can make is one group's, not the node's.
    dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] = attrs.field(factory=dict)
    #: Devices not Bound (Pending or Lost).
    unsettled: frozenset[DeviceKey] = frozenset()
    #: The same devices by their class's resource name ("" for a class without one): a placement cycle
    #: judges a name's again when room for it may have come (``Changes.names``), not every time.
    unsettled_by_name: Mapping[str, frozenset[DeviceKey]] = attrs.field(factory=dict)
    #: Devices with a bind request not answered yet (an answer pass acts on each).
    asking: frozenset[DeviceKey] = frozenset()
    #: Devices an answer pass acts on: Pending, or with a bind request not answered yet.
    waiting: frozenset[DeviceKey] = frozenset()
    #: A cycle's view narrows ``devices`` to the sets it plans; this is then the model's every device, which a
    #: compaction reads for the stopped holds it may move (R-BIND-11). None where ``devices`` is every device.
    every_device: Mapping[DeviceKey, DeviceView] | None = attrs.field(default=None, eq=False, repr=False)
    #: Which update of its model this is, and the model's log of what each update touched (not compared:
    #: two builds of the same objects are equal whatever their history).
    generation: int = attrs.field(default=0, eq=False)
    log: ChangeLog | None = attrs.field(default=None, eq=False, repr=False)

    def changes_since(self, earlier: Snapshot) -> Changes | None:
        """What changed after ``earlier``, an older snapshot of the same model; None: anything may have."""
        if self.log is None or earlier.log is not self.log or earlier.generation > self.generation:
            return None
        return self.log.since(earlier.generation)

    def sells_dra(self, class_name: str) -> bool:
        """The class exists and takes its units from a DRA driver (``source.dra``, SPEC §1.5)."""
        gpu_class = self.classes.get(class_name)
        return gpu_class is not None and gpu_class.dra is not None

    def usage_of(self, namespace: str) -> Usage:
        return self.subtree_usage.get(namespace, EMPTY_USAGE)

    def device(self, key: DeviceKey) -> DeviceView | None:
        return self.devices.get(key)
