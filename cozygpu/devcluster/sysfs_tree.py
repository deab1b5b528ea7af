"""sysfs trees in a tmp directory, laid out as a node's are.

Function directories live under ``devices/pci0000:XX/<bridge>/<BDF>`` and
everything else reaches them through relative symlinks, as on a node:
``bus/pci/devices/<BDF>``, ``driver`` -> ``bus/pci/drivers/<name>``,
``iommu_group`` -> ``kernel/iommu_groups/<N>`` (whose ``devices/`` links back),
``physfn``/``virtfn<i>``, ``bus/mdev/devices/<uuid>`` -> ``<parent>/<uuid>``,
``mdev_type`` -> ``<parent>/mdev_supported_types/<type>``.

The layouts at the bottom are the machines the agent must read correctly;
``board_for`` lays out the GPUs of a node added by hand
(``cozygpu cluster nodes add --gpus``) from its resource names and counts.
"""

from __future__ import annotations

import os
import re
import uuid as uuid_module
from collections.abc import Mapping
from pathlib import Path

import attrs


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


class SysfsTree:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dirs: dict[str, Path] = {}
        for sub in ("bus/pci/devices", "bus/pci/drivers", "kernel/iommu_groups", "devices"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def dir(self, address: str) -> Path:
        return self.dirs[address]

    def function(
        self,
        address: str,
        *,
        vendor: str,
        device: str,
        pci_class: str,
        driver: str | None = None,
        iommu_group: int | None = None,
        numa_node: int = 0,
        under: Path | None = None,
        sriov_totalvfs: int | None = None,
    ) -> Path:
        """One PCI function; ``under`` is its parent directory (a root-port bridge by default)."""
        domain, bus = address.split(":")[:2]
        parent = under if under is not None else self.root / "devices" / f"pci{domain}:{bus}" / f"{domain}:{bus}:00.0"
        path = parent / address
        path.mkdir(parents=True, exist_ok=True)
        self.dirs[address] = path
        _write(path / "vendor", f"0x{vendor}\n")
        _write(path / "device", f"0x{device}\n")
        _write(path / "class", f"{pci_class}\n")
        _write(path / "subsystem_vendor", f"0x{vendor}\n")
        _write(path / "numa_node", f"{numa_node}\n")
        _write(path / "driver_override", "(null)\n")
        uevent = (f"PCI_CLASS={pci_class[2:].upper()}\nPCI_ID={vendor.upper()}:{device.upper()}\n"
                  f"PCI_SLOT_NAME={address}\n")
        _write(path / "uevent", (f"DRIVER={driver}\n" if driver else "") + uevent)
        _link(self.root / "bus/pci/devices" / address, path)
        if driver:
            self.bind(address, driver)
        if iommu_group is not None:
            self.join_group(path, address, iommu_group)
        if sriov_totalvfs is not None:
            _write(path / "sriov_totalvfs", f"{sriov_totalvfs}\n")
            _write(path / "sriov_numvfs", "0\n")
        return path

    def bind(self, address: str, driver: str) -> None:
        drivers = self.root / "bus/pci/drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        _link(self.dir(address) / "driver", drivers)
        _link(drivers / address, self.dir(address))

    def join_group(self, member_dir: Path, member: str, group: int) -> None:
        group_dir = self.root / "kernel/iommu_groups" / str(group)
        (group_dir / "devices").mkdir(parents=True, exist_ok=True)
        _link(member_dir / "iommu_group", group_dir)
        _link(group_dir / "devices" / member, member_dir)

    def vf(self, pf: str, index: int, address: str, **kw: object) -> Path:
        """An SR-IOV VF of ``pf``: ``physfn`` on the VF, ``virtfn<index>`` on the PF."""
        pf_dir = self.dir(pf)
        path = self.function(address, under=pf_dir.parent, **kw)  # type: ignore[arg-type]
        _link(path / "physfn", pf_dir)
        _link(pf_dir / f"virtfn{index}", path)
        numvfs = sum(1 for entry in pf_dir.iterdir() if entry.name.startswith("virtfn"))
        _write(pf_dir / "sriov_numvfs", f"{numvfs}\n")
        return path

    def mdev_type(self, parent: str, type_id: str, *, name: str | None, available_instances: int) -> Path:
        path = self.dir(parent) / "mdev_supported_types" / type_id
        (path / "devices").mkdir(parents=True, exist_ok=True)
        if name is not None:
            _write(path / "name", f"{name}\n")
        _write(path / "available_instances", f"{available_instances}\n")
        _write(path / "device_api", "vfio-pci\n")
        _write(path / "description", "num_heads=4, frl_config=60, framebuffer=1024M\n")
        _link(self.root / "class/mdev_bus" / parent, self.dir(parent))
        return path

    def mdev(self, parent: str, uuid: str, type_id: str, *, iommu_group: int) -> Path:
        type_dir = self.dir(parent) / "mdev_supported_types" / type_id
        path = self.dir(parent) / uuid
        path.mkdir(parents=True, exist_ok=True)
        _link(path / "mdev_type", type_dir)
        _link(type_dir / "devices" / uuid, path)
        _link(self.root / "bus/mdev/devices" / uuid, path)
        (self.root / "bus/mdev/drivers/vfio_mdev").mkdir(parents=True, exist_ok=True)
        _link(path / "driver", self.root / "bus/mdev/drivers/vfio_mdev")
        self.join_group(path, uuid, iommu_group)
        return path

    def vgpu(self, vf: str, *, current: int, creatable: list[tuple[int, str]]) -> None:
        """The ``nvidia/`` directory of a vendor-specific vGPU VF."""
        lines = ["ID    : vGPU Name"] + [f"{type_id:<5} : {name}" for type_id, name in creatable]
        _write(self.dir(vf) / "nvidia" / "creatable_vgpu_types", "\n".join(lines) + "\n")
        _write(self.dir(vf) / "nvidia" / "current_vgpu_type", f"{current}\n")
        _write(self.dir(vf) / "nvidia" / "gpu_instance_id", "-1\n")


# -- layouts ------------------------------------------------------------------------------

NVIDIA = "10de"
VGA = "0x030000"
GPU_3D = "0x030200"
AUDIO = "0x040300"
BRIDGE_OTHER = "0x068000"
ETHERNET = "0x020000"


@attrs.frozen
class HgxPassthrough:
    gpus: tuple[str, str] = ("0000:18:00.0", "0000:9a:00.0")
    groups: tuple[int, int] = (30, 120)
    audio: tuple[str, str] = ("0000:18:00.1", "0000:9a:00.1")
    nvswitch: str = "0000:05:00.0"
    nvswitch_group: int = 5
    bmc_vga: str = "0000:03:00.0"
    resource: str = "nvidia.com/GH100_H100_SXM5_80GB"


def hgx_passthrough(tree: SysfsTree) -> HgxPassthrough:
    """Two H100s on vfio-pci, each with its audio function in its group; a vfio-bound NVSwitch; the BMC's VGA."""
    layout = HgxPassthrough()
    for gpu, audio, group, numa in zip(layout.gpus, layout.audio, layout.groups, (0, 1), strict=True):
        tree.function(gpu, vendor=NVIDIA, device="2330", pci_class=GPU_3D, driver="vfio-pci",
                      iommu_group=group, numa_node=numa)
        tree.function(audio, vendor=NVIDIA, device="22ba", pci_class=AUDIO, driver="vfio-pci",
                      iommu_group=group, numa_node=numa, under=tree.dir(gpu).parent)
    tree.function(layout.nvswitch, vendor=NVIDIA, device="22a3", pci_class=BRIDGE_OTHER, driver="vfio-pci",
                  iommu_group=layout.nvswitch_group)
    tree.function(layout.bmc_vga, vendor="1a03", device="2000", pci_class=VGA, driver="ast", iommu_group=3)
    return layout


@attrs.frozen
class MdevParentLayout:
    parent: str = "0000:41:00.0"
    group: int = 60
    small_type: str = "nvidia-222"
    big_type: str = "nvidia-223"
    small: tuple[str, ...] = (
        "3c1f4a8e-6f61-4b8e-9f4e-0b5c2f1a7d01",
        "3c1f4a8e-6f61-4b8e-9f4e-0b5c2f1a7d02",
        "3c1f4a8e-6f61-4b8e-9f4e-0b5c2f1a7d03",
    )
    big: tuple[str, ...] = (
        "9b2e0c44-1d2a-4f0e-8c3b-7a6d5e4f3b01",
        "9b2e0c44-1d2a-4f0e-8c3b-7a6d5e4f3b02",
    )
    small_groups: tuple[int, ...] = (201, 202, 203)
    big_groups: tuple[int, ...] = (204, 205)
    small_resource: str = "nvidia.com/GRID_T4-1Q"
    big_resource: str = "nvidia.com/GRID_T4-2Q"


def mdev_parent(tree: SysfsTree) -> MdevParentLayout:
    """A T4 on the vGPU host driver with three instances of one type and two of another."""
    layout = MdevParentLayout()
    tree.function(layout.parent, vendor=NVIDIA, device="1eb8", pci_class=GPU_3D, driver="nvidia",
                  iommu_group=layout.group, numa_node=0)
    tree.mdev_type(layout.parent, layout.small_type, name="GRID T4-1Q", available_instances=9)
    tree.mdev_type(layout.parent, layout.big_type, name="GRID T4-2Q", available_instances=2)
    tree.mdev_type(layout.parent, "nvidia-230", name=None, available_instances=0)
    for uuid, group in zip(layout.small, layout.small_groups, strict=True):
        tree.mdev(layout.parent, uuid, layout.small_type, iommu_group=group)
    for uuid, group in zip(layout.big, layout.big_groups, strict=True):
        tree.mdev(layout.parent, uuid, layout.big_type, iommu_group=group)
    return layout


@attrs.frozen
class VgpuVfLayout:
    pf: str = "0000:c1:00.0"
    #: current type 1414 and still listed as creatable; current 0; current 1415 no longer listed.
    vfs: tuple[str, str, str] = ("0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6")
    groups: tuple[int, int, int] = (131, 132, 133)
    resource: str = "nvidia.com/NVIDIA_L40S-24Q"


def vgpu_vfs(tree: SysfsTree) -> VgpuVfLayout:
    """An L40S PF on ``nvidia`` with SR-IOV VFs of the vendor-specific vGPU framework."""
    layout = VgpuVfLayout()
    tree.function(layout.pf, vendor=NVIDIA, device="26b9", pci_class=GPU_3D, driver="nvidia",
                  iommu_group=130, numa_node=1, sriov_totalvfs=32)
    for index, (vf, group) in enumerate(zip(layout.vfs, layout.groups, strict=True)):
        tree.vf(layout.pf, index, vf, vendor=NVIDIA, device="26b9", pci_class=GPU_3D, driver="nvidia",
                iommu_group=group, numa_node=1)
    tree.vgpu(layout.vfs[0], current=1414, creatable=[(1414, "NVIDIA L40S-24Q"), (1415, "NVIDIA L40S-48Q")])
    tree.vgpu(layout.vfs[1], current=0, creatable=[(1414, "NVIDIA L40S-24Q")])
    tree.vgpu(layout.vfs[2], current=1415, creatable=[])
    return layout


UNBOUND_GPU = "0000:e1:00.0"
UNBOUND_GROUP = 90


def unbound_gpu(tree: SysfsTree) -> str:
    tree.function(UNBOUND_GPU, vendor=NVIDIA, device="20b5", pci_class=GPU_3D, driver=None,
                  iommu_group=UNBOUND_GROUP, numa_node=1)
    return UNBOUND_GPU


CONTAINER_GPU = "0000:61:00.0"
CONTAINER_GROUP = 0
CONTAINER_RESOURCE = "nvidia.com/gpu"
CONTAINER_UUID = "GPU-6b3e1c0a-8f7d-4c2b-9e1a-2d4f6a8b0c1e"


def container_plugin_gpu(tree: SysfsTree) -> str:
    """An H100 PCIe on ``nvidia``, handed out by NVIDIA's container plugin by NVML UUID; in group 0."""
    tree.function(CONTAINER_GPU, vendor=NVIDIA, device="2331", pci_class=GPU_3D, driver="nvidia",
                  iommu_group=CONTAINER_GROUP, numa_node=0)
    return CONTAINER_GPU


@attrs.frozen
class ConnectXLayout:
    pf: str = "0000:af:00.0"
    vf: str = "0000:af:00.2"
    vf_group: int = 150
    resource: str = "mellanox.com/MT2892_FAMILY_CX6DX_VF"


def connectx_vf(tree: SysfsTree) -> ConnectXLayout:
    """A ConnectX-6 Dx PF on mlx5_core with one VF on vfio-pci (KubeVirt's PCI plugin hands it out by group)."""
    layout = ConnectXLayout()
    tree.function(layout.pf, vendor="15b3", device="101d", pci_class=ETHERNET, driver="mlx5_core",
                  iommu_group=149, numa_node=1, sriov_totalvfs=8)
    tree.vf(layout.pf, 0, layout.vf, vendor="15b3", device="101e", pci_class=ETHERNET, driver="vfio-pci",
            iommu_group=layout.vf_group, numa_node=1)
    return layout


# -- boards for nodes added by hand (`cozygpu cluster nodes add --gpus NAME=COUNT`) -------------------

#: Passthrough GPUs by the name KubeVirt's GPU device plugins give them (``<vendor domain>/<PCI device
#: name with spaces and brackets as underscores>``), compared case-insensitively: their PCI device ID.
PASSTHROUGH_MODELS: dict[str, str] = {
    "GH100_H100_SXM5_80GB": "2330",
    "GH100_H100_PCIE": "2331",
    "GH100_H200_SXM_141GB": "2335",
    "GA100_A100_SXM4_80GB": "20b2",
    "GA100_A100_PCIE_80GB": "20b5",
    "GA100_A100_PCIE_40GB": "20f1",
    "AD102GL_L40S": "26b9",
    "AD104GL_L4": "27b8",
    "TU104GL_TESLA_T4": "1eb8",
}
#: The GPUs behind NVIDIA vGPU profiles (``GRID_T4-1Q``, ``NVIDIA_L40S-24Q``): the parent's PCI device ID.
VGPU_MODELS: dict[str, str] = {"T4": "1eb8", "A10": "2236", "A16": "25b6", "A100": "20b5", "L4": "27b8",
                               "L40S": "26b9", "H100": "2331"}
#: The vendor of a resource name's domain; any other domain reads as NVIDIA's.
VENDORS: dict[str, str] = {"nvidia.com": NVIDIA, "amd.com": "1002", "intel.com": "8086"}
#: The PCI device ID of a GPU whose name none of the tables above knows.
GENERIC_DEVICE = "0000"
#: An NVIDIA vGPU profile: ``[GRID_|NVIDIA_]<GPU>-<framebuffer GiB><series A|B|C|Q>``.
VGPU_PROFILE = re.compile(r"^(?:GRID_|NVIDIA_)?(?P<gpu>[A-Za-z0-9_]+)-(?P<size>\d+)(?P<series>[ABCQ])$")
#: Passthrough functions one board can hold (a PCI bus each, below the vGPU parents).
MAX_PASSTHROUGH = 0x80
FIRST_BUS, FIRST_GROUP, FIRST_MDEV_GROUP = 0x10, 30, 1000


@attrs.frozen
class PassthroughGpu:
    """A whole GPU on vfio-pci, alone in its IOMMU group: KubeVirt's PCI plugin hands it out by group."""

    resource: str
    address: str
    vendor: str
    device: str
    group: int
    numa: int


@attrs.frozen
class VgpuType:
    """One mdev type of a vGPU parent, with every instance created (``uuid``, own IOMMU group)."""

    resource: str
    type_id: str
    name: str
    instances: tuple[tuple[str, int], ...]


@attrs.frozen
class VgpuParent:
    """A GPU on the vGPU host driver (``nvidia``), an mdev parent of the profiles of one GPU model."""

    address: str
    device: str
    group: int
    types: tuple[VgpuType, ...]


@attrs.frozen
class GpuBoard:
    """The GPU functions of a node added by hand, from its ``{resource name: units}``.

    - a vGPU profile name (:data:`VGPU_PROFILE`, e.g. ``nvidia.com/GRID_T4-1Q``): mdev instances of
      that type on a parent GPU of the profile's model (the profiles of one model share a parent); its
      plugin advertises each instance by UUID;
    - any other name: that many whole GPUs on vfio-pci, each in its own IOMMU group, advertised by
      group as KubeVirt's PCI device plugin does; the model from :data:`PASSTHROUGH_MODELS`, and a
      name it does not know is a generic GPU (device ID :data:`GENERIC_DEVICE`) of the vendor of its
      domain (:data:`VENDORS`).
    """

    passthrough: tuple[PassthroughGpu, ...]
    vgpu_parents: tuple[VgpuParent, ...]

    def lay_out(self, tree: SysfsTree) -> None:
        for gpu in self.passthrough:
            tree.function(gpu.address, vendor=gpu.vendor, device=gpu.device, pci_class=GPU_3D, driver="vfio-pci",
                          iommu_group=gpu.group, numa_node=gpu.numa)
        for parent in self.vgpu_parents:
            tree.function(parent.address, vendor=NVIDIA, device=parent.device, pci_class=GPU_3D, driver="nvidia",
                          iommu_group=parent.group, numa_node=0)
            for vgpu_type in parent.types:
                tree.mdev_type(parent.address, vgpu_type.type_id, name=vgpu_type.name, available_instances=0)
                for uuid, group in vgpu_type.instances:
                    tree.mdev(parent.address, uuid, vgpu_type.type_id, iommu_group=group)

    def plugin_devices(self) -> list[tuple[str, str, int]]:
        """What the device plugins advertise: (resource name, device ID, NUMA node)."""
        devices = [(gpu.resource, str(gpu.group), gpu.numa) for gpu in self.passthrough]
        devices += [(vgpu_type.resource, uuid, 0) for parent in self.vgpu_parents for vgpu_type in parent.types
                    for uuid, _ in vgpu_type.instances]
        return devices


def board_for(gpus: Mapping[str, int]) -> GpuBoard:
    """The board serving ``gpus`` (:class:`GpuBoard`); ValueError for a name or count no board can have."""
    whole: list[tuple[str, str, str]] = []  # (resource, vendor, device) per passthrough GPU
    profiles: dict[str, list[tuple[str, int]]] = {}  # GPU model -> (resource, units) of its profiles
    for resource, count in gpus.items():
        domain, slash, name = resource.partition("/")
        if not slash or not domain or not name or "/" in name:
            raise ValueError(f"{resource!r} is not a resource name of the form DOMAIN/NAME "
                             "(e.g. nvidia.com/GH100_H100_SXM5_80GB)")
        if count < 1:
            raise ValueError(f"{resource}: {count} units; at least 1")
        if (profile := VGPU_PROFILE.match(name)) is not None:
            profiles.setdefault(profile["gpu"].upper(), []).append((resource, count))
        else:
            vendor = VENDORS.get(domain.lower(), NVIDIA)
            whole += [(resource, vendor, PASSTHROUGH_MODELS.get(name.upper(), GENERIC_DEVICE))] * count
    if len(whole) > MAX_PASSTHROUGH:
        raise ValueError(f"{len(whole)} passthrough GPUs: at most {MAX_PASSTHROUGH} on one node")
    # The first half on NUMA node 0, the rest on node 1, as on a two-socket server.
    passthrough = tuple(
        PassthroughGpu(resource, f"0000:{FIRST_BUS + index:02x}:00.0", vendor, device, FIRST_GROUP + index,
                       numa=0 if index < (len(whole) + 1) // 2 else 1)
        for index, (resource, vendor, device) in enumerate(whole))
    parents = []
    mdev_group = FIRST_MDEV_GROUP
    for index, (model, served) in enumerate(sorted(profiles.items())):
        types = []
        for type_index, (resource, count) in enumerate(served):
            name = resource.partition("/")[2]
            uuids = tuple(str(uuid_module.uuid5(uuid_module.NAMESPACE_URL, f"{resource}#{i}")) for i in range(count))
            types.append(VgpuType(resource, f"nvidia-{500 + 10 * index + type_index}", name.replace("_", " "),
                                  tuple(zip(uuids, range(mdev_group, mdev_group + count), strict=True))))
            mdev_group += count
        parents.append(VgpuParent(f"0000:{FIRST_BUS + MAX_PASSTHROUGH + index:02x}:00.0",
                                  VGPU_MODELS.get(model, GENERIC_DEVICE), FIRST_GROUP + MAX_PASSTHROUGH + index,
                                  tuple(types)))
    return GpuBoard(passthrough, tuple(parents))
