"""sysfs view + kubelet view -> the agent's part of GPUNode status (R-AGENT). Pure.

Device plugins name their devices in one of a few shapes, and the agent places
each ID by its shape rather than by knowing the plugin:

=====================  ====================================  ===============================
shape                  from                                  placed on
=====================  ====================================  ===============================
``0000:3b:00.0``       NVIDIA kubevirt plugin >= 1.5, the    that PCI function
                       vendor-specific vGPU VF plugins
mdev UUID              NVIDIA kubevirt plugin (vGPU)         the mdev's parent function
``42`` (IOMMU group)   KubeVirt's PCI and mdev plugins,      the group's member that counts:
                       NVIDIA kubevirt plugin <= 1.4         a function bound to vfio, a vGPU
                                                             VF bound to ``nvidia`` with a
                                                             non-zero ``current_vgpu_type``,
                                                             or an mdev (its parent)
``GPU-…``/``MIG-…``    NVIDIA's container plugin (NVML)      nowhere: only the resource name
=====================  ====================================  ===============================

A group counts only through those members, so an integer that is no such
group (a plain index) is not read as one. A resource is a GPU resource when
one of its IDs lands on a GPU function or is an NVML UUID; only those join
``resourceNames`` (a ConnectX VF's resource, or ``devices.kubevirt.io/kvm``,
must not become a GPU name). An ID of a GPU resource that cannot be placed is
reported as a problem.

Counting (R-MOD-7 reads it): ``allocatable`` is the number of distinct
allocatable IDs of a resource that land on a function. kubelet lists only
healthy devices as allocatable, so health comes from here; it lists a device
once per NUMA node, so IDs are de-duplicated per resource. ``allocated`` counts
the distinct IDs held by pods that are not in a final phase (decided by the
caller through the API: ``PodState``).

Entries: one per GPU function, with ``resourceName`` ``""`` when kubelet has
no device on it. A function that serves several resource names (an mdev
parent with instances of two types) gets one entry per name, so the units a
node serves for a name stay a plain sum over entries of that name; address and
resource name together identify an entry.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from cozygpu.agent.kubelet import KubeletView, PodDevices, held_ids
from cozygpu.agent.sysfs import PciFunction, SysfsView

KIND_PASSTHROUGH: Final = "Passthrough"
KIND_SRIOV_VF: Final = "SRIOVVF"
KIND_MDEV_PARENT: Final = "MdevParent"

_PCI_ADDRESS: Final = re.compile(r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-7])$", re.IGNORECASE)
_UUID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
_GROUP: Final = re.compile(r"^[0-9]+$")
_NVML: Final = re.compile(r"^(GPU|MIG)-\S+$")


# -- placing one device-plugin ID -------------------------------------------------------


@attrs.frozen
class OnGpu:
    """The ID is a device of the GPU function at ``address``."""

    address: str
    #: A problem worth reporting about how it was placed (an IOMMU group with several GPUs).
    note: str | None = None


@attrs.frozen
class NotGpu:
    """The ID is a device of something that is no GPU (a NIC VF): not ours."""


@attrs.frozen
class NvmlGpu:
    """An NVML UUID of NVIDIA's container plugin: a GPU, but sysfs cannot say which."""


@attrs.frozen
class Unplaced:
    reason: str


Placement = OnGpu | NotGpu | NvmlGpu | Unplaced


def place(view: SysfsView, device_id: str) -> Placement:
    """Where a device-plugin ID lands, by its shape (table in the module docstring)."""
    if _NVML.match(device_id):
        return NvmlGpu()
    address = _PCI_ADDRESS.match(device_id)
    if address:
        return _place_function(view, f"{(address.group(1) or '0000').lower()}:{address.group(2).lower()}")
    if _UUID.match(device_id):
        return _place_mdev(view, device_id.lower())
    if _GROUP.match(device_id):
        return _place_group(view, int(device_id))
    return Unplaced("not a PCI address, an mdev UUID or an IOMMU group number")


def _place_function(view: SysfsView, address: str) -> Placement:
    fn = view.functions.get(address)
    if fn is None:
        return Unplaced(f"no PCI function {address} in sysfs")
    return OnGpu(address) if fn.is_gpu else NotGpu()


def _place_mdev(view: SysfsView, uuid: str) -> Placement:
    mdev = view.mdevs.get(uuid)
    if mdev is None:
        return Unplaced(f"no mdev {uuid} in sysfs")
    parent = view.functions.get(mdev.parent)
    if parent is None:
        return Unplaced(f"mdev {uuid}: parent {mdev.parent} is not a PCI function in sysfs")
    return OnGpu(parent.address) if parent.is_gpu else NotGpu()


def _counts_in_group(fn: PciFunction) -> bool:
    return fn.is_vfio_bound or fn.is_active_vgpu_vf


def _place_group(view: SysfsView, group: int) -> Placement:
    members = view.iommu_groups.get(group)
    if members is None:
        return Unplaced(f"no IOMMU group {group} in sysfs")
    counted: set[PciFunction] = set()
    for member in members:
        mdev = view.mdevs.get(member)
        if mdev is not None:
            parent = view.functions.get(mdev.parent)
            if parent is not None:
                counted.add(parent)
            continue
        fn = view.functions.get(member)
        if fn is not None and _counts_in_group(fn):
            counted.add(fn)
    gpus = sorted(fn.address for fn in counted if fn.is_gpu)
    if gpus:
        note = None
        if len(gpus) > 1:
            note = (f"IOMMU group {group} holds several GPU functions that count ({', '.join(gpus)}); "
                    f"its device is counted once, for {gpus[0]}")
        return OnGpu(gpus[0], note=note)
    if counted:
        return NotGpu()
    return Unplaced(f"IOMMU group {group} has no member bound to vfio, no active vGPU VF and no mdev")


# -- the pods kubelet lists --------------------------------------------------------------


class PodVerdict(enum.Enum):
    #: Exists on this node and not in a final phase: its devices are held.
    LIVE = "Live"
    #: Succeeded or Failed: kubelet 1.32/1.33 still list it, but it holds nothing.
    FINAL = "Final"
    #: No such pod any more: a leftover in kubelet's list.
    GONE = "Gone"
    #: The name now belongs to a pod on another node: kubelet lists an old incarnation.
    ELSEWHERE = "Elsewhere"
    #: The lookup failed: counted as held (never free), and reported.
    UNKNOWN = "Unknown"


@attrs.frozen
class PodState:
    verdict: PodVerdict
    uid: str = ""
    detail: str = ""

    @property
    def holds_devices(self) -> bool:
        return self.verdict in (PodVerdict.LIVE, PodVerdict.UNKNOWN)


PodKey = tuple[str, str]


class _Placer:
    """``place`` remembered per ID: one view, many IDs, each asked for more than once."""

    def __init__(self, view: SysfsView) -> None:
        self.view = view
        self._known: dict[str, Placement] = {}

    def __call__(self, device_id: str) -> Placement:
        placement = self._known.get(device_id)
        if placement is None:
            placement = self._known[device_id] = place(self.view, device_id)
        return placement

    def on_gpu(self, device_id: str) -> str | None:
        """The GPU function's address an ID lands on, if it lands on one."""
        placement = self(device_id)
        return placement.address if isinstance(placement, OnGpu) else None


def pods_to_look_up(sysfs: SysfsView, kubelet: KubeletView) -> list[PodKey]:
    """The pods whose state matters: those holding a device that lands on a GPU function."""
    placer = _Placer(sysfs)
    return sorted({
        (pod.namespace, pod.name)
        for pod in kubelet.pods
        if any(placer.on_gpu(device_id) for ids in held_ids(pod).values() for device_id in ids)
    })


# -- the report ----------------------------------------------------------------------------


@attrs.frozen
class DeviceReport:
    function: PciFunction
    resource_name: str
    allocatable: int
    allocated: int

    @property
    def kind(self) -> str:
        if self.function.mdev_types is not None:
            return KIND_MDEV_PARENT
        if self.function.physfn is not None:
            return KIND_SRIOV_VF
        return KIND_PASSTHROUGH

    def to_status(self) -> dict[str, Any]:
        fn = self.function
        entry: dict[str, Any] = {
            "address": fn.address,
            "vendorID": fn.vendor,
            "deviceID": fn.device,
            "class": fn.class_text,
            "driver": fn.driver,
            "numaNode": fn.numa_node,
            "resourceName": self.resource_name,
            "kind": self.kind,
            "allocatable": self.allocatable,
            "allocated": self.allocated,
        }
        if fn.iommu_group is not None:
            # Absent, not null, when the IOMMU is off: a merge patch drops nulls inside a list anyway.
            entry["iommuGroup"] = fn.iommu_group
        if fn.mdev_types is not None:
            entry["mdevTypes"] = [
                {"id": t.id, "name": t.name, "availableInstances": t.available_instances, "instances": t.instances}
                for t in fn.mdev_types
            ]
        if fn.physfn is not None:
            entry["physfn"] = fn.physfn
        if fn.vgpu is not None:
            if fn.vgpu.current_type != 0:
                entry["vgpuType"] = fn.vgpu.current_type_name or str(fn.vgpu.current_type)
            entry["creatableVGPUTypes"] = [t.name for t in fn.vgpu.creatable]
        return entry


@attrs.frozen
class Inventory:
    devices: tuple[DeviceReport, ...]
    #: Sorted, unique GPU resource names, placeable or not.
    resource_names: tuple[str, ...]
    #: Why this view is incomplete (sysfs content, IDs that cannot be placed, pod lookups).
    problems: tuple[str, ...]

    def to_status(self) -> dict[str, Any]:
        """``devices``, ``resourceNames`` and the totals the printer columns show; the caller adds ``agent``."""
        return {
            "devices": [device.to_status() for device in self.devices],
            "resourceNames": list(self.resource_names),
            "deviceCount": len(self.devices),
            "allocatable": sum(device.allocatable for device in self.devices),
        }


def build_inventory(
    sysfs: SysfsView,
    kubelet: KubeletView,
    pod_states: Mapping[PodKey, PodState],
) -> Inventory:
    """Place every ID, count per function and name the GPU resources (module docstring)."""
    placer = _Placer(sysfs)
    problems: list[str] = list(sysfs.problems)
    allocatable_ids = kubelet.allocatable_ids()
    allocatable = _count_per_function(placer, allocatable_ids)
    held = _held_by_live_pods(placer, kubelet.pods, pod_states, problems)
    # Every name kubelet shows, allocatable or only held (a device held while unhealthy).
    listed: dict[str, set[str]] = {name: set(ids) for name, ids in allocatable_ids.items()}
    for pod in kubelet.pods:
        for name, ids in held_ids(pod).items():
            listed.setdefault(name, set()).update(ids)
    names = _gpu_resource_names(placer, listed, problems)
    devices = tuple(_device_reports(sysfs.gpus(), allocatable, held, problems))
    return Inventory(devices=devices, resource_names=names, problems=tuple(problems))


FunctionKey = tuple[str, str]  # (PCI address, resource name)


def _count_per_function(placer: _Placer, ids_by_name: Mapping[str, frozenset[str]]) -> dict[FunctionKey, int]:
    counts: dict[FunctionKey, int] = {}
    for name, ids in ids_by_name.items():
        for device_id in ids:
            address = placer.on_gpu(device_id)
            if address is not None:
                counts[(address, name)] = counts.get((address, name), 0) + 1
    return counts


def _held_by_live_pods(
    placer: _Placer, pods: Iterable[PodDevices], pod_states: Mapping[PodKey, PodState], problems: list[str],
) -> dict[FunctionKey, set[str]]:
    """The distinct IDs per function held by pods that still hold devices (``PodState.holds_devices``)."""
    held: dict[FunctionKey, set[str]] = {}
    for pod in pods:
        state = pod_states.get((pod.namespace, pod.name))
        if state is None or not state.holds_devices:
            continue
        if state.verdict is PodVerdict.UNKNOWN:
            problems.append(f"pod {pod.namespace}/{pod.name}: {state.detail or 'state unknown'}; "
                            "its devices count as held")
        for name, ids in held_ids(pod).items():
            for device_id in ids:
                address = placer.on_gpu(device_id)
                if address is not None:
                    held.setdefault((address, name), set()).add(device_id)
    return held


def _gpu_resource_names(placer: _Placer, listed: Mapping[str, set[str]], problems: list[str]) -> tuple[str, ...]:
    """Names with an ID on a GPU function or an NVML UUID; the other IDs of those names are problems."""
    names: list[str] = []
    for name, ids in sorted(listed.items()):
        placements = {device_id: placer(device_id) for device_id in sorted(ids)}
        if any(isinstance(p, OnGpu | NvmlGpu) for p in placements.values()):
            names.append(name)
            problems.extend(_id_problems(name, placements))
    return tuple(names)


def _id_problems(name: str, placements: Mapping[str, Placement]) -> Iterable[str]:
    notes: set[str] = set()
    for device_id, placement in placements.items():
        if isinstance(placement, Unplaced):
            yield f"{name}: device {device_id!r} cannot be placed: {placement.reason}"
        elif isinstance(placement, NotGpu):
            yield f"{name}: device {device_id!r} is not a GPU function"
        elif isinstance(placement, OnGpu) and placement.note and placement.note not in notes:
            notes.add(placement.note)
            yield placement.note


def _device_reports(
    gpus: Iterable[PciFunction],
    allocatable: Mapping[FunctionKey, int],
    held: Mapping[FunctionKey, set[str]],
    problems: list[str],
) -> Iterable[DeviceReport]:
    for fn in gpus:
        names = sorted({name for address, name in (*allocatable, *held) if address == fn.address})
        if len(names) > 1 and fn.mdev_types is None:
            problems.append(f"{fn.address} is advertised under several resource names ({', '.join(names)}): "
                            "two plugins may hand it out twice")
        for name in names or [""]:
            yield DeviceReport(
                function=fn,
                resource_name=name,
                allocatable=allocatable.get((fn.address, name), 0),
                allocated=len(held.get((fn.address, name), ())),
            )
