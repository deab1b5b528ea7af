"""The typed snapshot every decision reads: views of the cluster objects, and indexes over them.

Why: the binder, the webhooks, the catalog and the CLI each hold their own
cache. Each turns it into this one shape (the builder sits beside the cache,
``cozygpu.views.build``) and asks the same model functions, so their
answers cannot drift apart.

Contract:
- The views of the cluster's objects are ``cozygpu.model.views``'s and the
  change log ``cozygpu.model.changelog``'s; both are named here too, as the
  shape a decision reads.
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

from collections.abc import Mapping
from datetime import datetime

import attrs

from cozygpu.model.changelog import ChangeLog, Changes, touch
from cozygpu.model.views import (
    EMPTY_USAGE,
    FINAL_POD_PHASES,
    Attachment,
    BindAnswer,
    BindRequest,
    BudgetValue,
    CompactionPolicy,
    DeviceKey,
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
    TenantBudgets,
    Toleration,
    Usage,
    VmiKey,
    VMIView,
)

__all__ = [
    "EMPTY_USAGE",
    "FINAL_POD_PHASES",
    "Attachment",
    "BindAnswer",
    "BindRequest",
    "BudgetValue",
    "ChangeLog",
    "Changes",
    "ClassAvailability",
    "CompactionPolicy",
    "DeviceKey",
    "DeviceView",
    "DraGroup",
    "DraSource",
    "GPUClassView",
    "LabelSelector",
    "Ledger",
    "MediatedDevice",
    "Mode",
    "NamespaceView",
    "NodeCapacity",
    "NodeInventory",
    "NodeSelectorTerm",
    "NodeView",
    "OnCordon",
    "PciHostDevice",
    "PermittedHostDevices",
    "Phase",
    "PodPhase",
    "PodView",
    "SelectorRequirement",
    "Snapshot",
    "Taint",
    "TenantBudgets",
    "Toleration",
    "Usage",
    "VMIView",
    "VmiKey",
    "touch",
]


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
