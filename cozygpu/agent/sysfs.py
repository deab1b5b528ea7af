"""Read the node's PCI functions, mdevs and IOMMU groups from sysfs (R-AGENT).

The reader is synchronous file reads and nothing else: the agent calls it in a
worker thread, and tests point it at trees they build. The root is injectable
(``/sys`` on a node, ``/host/sys`` in the DaemonSet, a tmp directory in tests),
and every path it reports is relative to that root.

What it reads (layout in the kubelet/sysfs reference, §4):

- every PCI function under ``bus/pci/devices``: vendor, device, class, bound
  driver (basename of the ``driver`` link; no link means unbound), IOMMU group
  (basename of the ``iommu_group`` link; none when the IOMMU is off), NUMA
  node (-1 unknown), SR-IOV (``sriov_totalvfs`` marks a PF, ``physfn`` a VF);
- for GPU functions only (vendor NVIDIA, AMD or Intel and class 0x0300 VGA or
  0x0302 3D; so not the HD-audio function beside a GPU, not an NVSwitch
  bridge, not a BMC's VGA): the mdev types a parent offers with their
  instances, and the vendor-specific vGPU state of an NVIDIA VF
  (``nvidia/creatable_vgpu_types``, ``nvidia/current_vgpu_type``);
- every mdev under ``bus/mdev/devices`` (parent, type, own IOMMU group);
- every IOMMU group's members under ``kernel/iommu_groups``.

Contract: bad content is reported, never fatal. An unreadable attribute or a
dangling link becomes a line in ``SysfsView.problems`` and the attribute its
"unknown" value; only a root with no PCI device directory at all raises
``SysfsUnavailable``, since a view with no functions would read as a node that
lost every GPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

#: PCI vendor IDs of GPU makers (lower-case hex, no ``0x``).
NVIDIA: Final = "10de"
AMD: Final = "1002"
INTEL: Final = "8086"
GPU_VENDORS: Final = frozenset({NVIDIA, AMD, INTEL})
#: PCI base class + subclass of GPU functions: VGA-compatible and 3D controller.
GPU_CLASSES: Final = frozenset({0x0300, 0x0302})

_VFIO_DRIVER: Final = "vfio-pci"
_CREATABLE_LINE: Final = re.compile(r"^\s*(\d+)\s*:\s*(.+?)\s*$")


class SysfsUnavailable(Exception):
    """The root holds no PCI device directory: nothing about the node can be said."""


def is_vfio_driver(driver: str) -> bool:
    """``vfio-pci`` or a vfio-pci variant driver (``nvgrace_gpu_vfio_pci``, ``mlx5_vfio_pci``, ...)."""
    normalized = driver.replace("_", "-")
    return normalized == _VFIO_DRIVER or normalized.endswith("-" + _VFIO_DRIVER)


@attrs.frozen
class MdevType:
    """One ``mdev_supported_types/<id>`` directory of a parent."""

    id: str
    #: The ``name`` attribute (what KubeVirt's mdevNameSelector matches), or the id when absent.
    name: str
    available_instances: int
    #: How many mdevs of this type exist on the parent now.
    instances: int


@attrs.frozen
class VgpuType:
    id: int
    name: str


@attrs.frozen
class Vgpu:
    """The vendor-specific vGPU state of an NVIDIA SR-IOV VF (its ``nvidia/`` directory)."""

    #: ``current_vgpu_type``; 0 means no vGPU is created on the VF.
    current_type: int
    creatable: tuple[VgpuType, ...]

    @property
    def current_type_name(self) -> str | None:
        for vgpu_type in self.creatable:
            if vgpu_type.id == self.current_type:
                return vgpu_type.name
        return None


@attrs.frozen
class PciFunction:
    """One PCI function. For a function that is no GPU only what placing IDs needs is read:
    vendor, class, driver, IOMMU group and SR-IOV links (``device`` is ``""``, ``numa_node`` -1)."""

    address: str
    #: Lower-case hex without ``0x``: ``10de``.
    vendor: str
    device: str
    #: The 24-bit class code, e.g. ``0x030200``.
    pci_class: int
    #: Basename of the bound driver, ``""`` when unbound.
    driver: str
    iommu_group: int | None
    #: -1 when unknown.
    numa_node: int
    #: The PF address of an SR-IOV VF.
    physfn: str | None
    #: Has ``sriov_totalvfs``: an SR-IOV physical function.
    is_pf: bool
    #: The mdev types of an mdev parent (read for GPUs only); ``None`` for a function that is no parent.
    mdev_types: tuple[MdevType, ...] | None
    #: The vGPU state of an NVIDIA VF with an ``nvidia/`` directory (read for GPUs only).
    vgpu: Vgpu | None

    @property
    def class_text(self) -> str:
        return f"0x{self.pci_class:06x}"

    @property
    def is_gpu(self) -> bool:
        return self.vendor in GPU_VENDORS and (self.pci_class >> 8) in GPU_CLASSES

    @property
    def is_vfio_bound(self) -> bool:
        return is_vfio_driver(self.driver)

    @property
    def is_active_vgpu_vf(self) -> bool:
        """A vGPU VF of the vendor-specific VFIO framework with a vGPU created on it.

        Such a VF stays bound to ``nvidia`` and KubeVirt (1.9+) advertises it by its
        IOMMU group: not a PF, and ``current_vgpu_type`` present and non-zero.
        """
        return (self.driver == "nvidia" and not self.is_pf and self.vgpu is not None
                and self.vgpu.current_type != 0)


@attrs.frozen
class Mdev:
    uuid: str
    #: The PCI address of the parent function.
    parent: str
    #: The type id (``nvidia-222``), ``""`` when the ``mdev_type`` link is missing.
    type_id: str
    iommu_group: int | None


@attrs.frozen
class SysfsView:
    #: Every PCI function, GPU or not, by address.
    functions: Mapping[str, PciFunction]
    #: Every mdev by UUID.
    mdevs: Mapping[str, Mdev]
    #: IOMMU group number -> member names (PCI addresses and mdev UUIDs).
    iommu_groups: Mapping[int, frozenset[str]]
    #: What could not be read, relative to the root.
    problems: tuple[str, ...]

    def gpus(self) -> list[PciFunction]:
        return [fn for _, fn in sorted(self.functions.items()) if fn.is_gpu]


def read_sysfs(root: str | os.PathLike[str], *, gpu_vendors: frozenset[str] = GPU_VENDORS) -> SysfsView:
    """Read the view under ``root`` (blocking: call it off the event loop)."""
    return _Reader(Path(root), gpu_vendors).read()


class _Reader:
    def __init__(self, root: Path, gpu_vendors: frozenset[str]) -> None:
        self.root = root
        self.gpu_vendors = gpu_vendors
        self.problems: list[str] = []

    # -- primitives: each turns a bad read into a problem and an "unknown" value ----------

    def _rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    def _problem(self, path: Path, what: str) -> None:
        self.problems.append(f"{self._rel(path)}: {what}")

    def _text(self, path: Path, *, required: bool = True) -> str | None:
        try:
            return path.read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            if required:
                self._problem(path, "missing")
            return None
        except OSError as err:
            self._problem(path, f"unreadable ({type(err).__name__}: {err.strerror or err})")
            return None

    def _int(self, path: Path, *, base: int = 10, required: bool = True) -> int | None:
        text = self._text(path, required=required)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            self._problem(path, f"not a number: {text[:40]!r}")
            return None

    def _hex_id(self, path: Path) -> str | None:
        """``0x10de`` -> ``10de``."""
        value = self._int(path, base=16)
        return None if value is None else f"{value:04x}"

    def _link_name(self, path: Path) -> str | None:
        """The basename of a symlink's target (the link may dangle); ``None`` when there is no link."""
        try:
            return os.path.basename(os.readlink(path))
        except FileNotFoundError:
            return None
        except OSError as err:
            self._problem(path, f"not a readable link ({type(err).__name__})")
            return None

    def _group(self, path: Path) -> int | None:
        name = self._link_name(path)
        if name is None:
            return None
        if not name.isdigit():
            self._problem(path, f"not an IOMMU group link: {name!r}")
            return None
        return int(name)

    def _listdir(self, path: Path) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError as err:
            self._problem(path, f"unreadable directory ({type(err).__name__})")
            return []

    # -- the view ------------------------------------------------------------------------

    def read(self) -> SysfsView:
        bus = self.root / "bus" / "pci" / "devices"
        try:
            entries = sorted(os.listdir(bus))
        except OSError as err:
            raise SysfsUnavailable(f"{self._rel(bus)}: cannot list PCI devices ({type(err).__name__}); "
                                   "is the sysfs root right?") from err
        functions: dict[str, PciFunction] = {}
        for address in entries:
            fn = self._function(bus / address, address.lower())
            if fn is not None:
                functions[fn.address] = fn
        return SysfsView(
            functions=functions,
            mdevs=self._mdevs(),
            iommu_groups=self._iommu_groups(),
            problems=tuple(self.problems),
        )

    def _function(self, path: Path, address: str) -> PciFunction | None:
        if not path.is_dir():
            self._problem(path, "dangling link" if path.is_symlink() else "not a device directory")
            return None
        vendor = self._hex_id(path / "vendor")
        pci_class = self._int(path / "class", base=16)
        if vendor is None or pci_class is None:
            self._problem(path, "vendor or class unknown: cannot tell whether it is a GPU; skipped")
            return None
        is_gpu = vendor in self.gpu_vendors and (pci_class >> 8) in GPU_CLASSES
        driver = self._link_name(path / "driver") or ""
        if not is_gpu:
            # Only what placing IDs needs; bad content of a NIC or a bridge is not ours to report.
            group = self._quiet_link(path / "iommu_group")
            return PciFunction(
                address=address, vendor=vendor, device="", pci_class=pci_class, driver=driver,
                iommu_group=int(group) if group and group.isdigit() else None, numa_node=-1,
                physfn=self._quiet_link(path / "physfn"),
                is_pf=(path / "sriov_totalvfs").exists(), mdev_types=None, vgpu=None,
            )
        numa = self._int(path / "numa_node", required=False)
        return PciFunction(
            address=address,
            vendor=vendor,
            device=self._hex_id(path / "device") or "",
            pci_class=pci_class,
            driver=driver,
            iommu_group=self._group(path / "iommu_group"),
            numa_node=-1 if numa is None else numa,
            physfn=self._link_name(path / "physfn"),
            is_pf=(path / "sriov_totalvfs").exists(),
            mdev_types=self._mdev_types(path / "mdev_supported_types"),
            vgpu=self._vgpu(path / "nvidia") if vendor == NVIDIA else None,
        )

    @staticmethod
    def _quiet_link(path: Path) -> str | None:
        try:
            return os.path.basename(os.readlink(path))
        except OSError:
            return None

    def _mdev_types(self, path: Path) -> tuple[MdevType, ...] | None:
        if not path.is_dir():
            return None
        types = []
        for type_id in self._listdir(path):
            type_dir = path / type_id
            name = self._text(type_dir / "name", required=False)
            available = self._int(type_dir / "available_instances")
            types.append(MdevType(
                id=type_id,
                name=name or type_id,
                available_instances=0 if available is None else available,
                instances=len(self._listdir(type_dir / "devices")),
            ))
        return tuple(types)

    def _vgpu(self, path: Path) -> Vgpu | None:
        current = path / "current_vgpu_type"
        if not current.exists():
            return None
        current_type = self._int(current)
        creatable_text = self._text(path / "creatable_vgpu_types", required=False) or ""
        creatable = []
        for line in creatable_text.splitlines():
            match = _CREATABLE_LINE.match(line)
            if match:  # the "ID : Name" header and blank lines do not match
                creatable.append(VgpuType(id=int(match.group(1)), name=match.group(2)))
        # An unreadable current type is reported and taken as "no vGPU": nothing is counted through it.
        return Vgpu(current_type=current_type or 0, creatable=tuple(creatable))

    def _mdevs(self) -> dict[str, Mdev]:
        bus = self.root / "bus" / "mdev" / "devices"
        mdevs: dict[str, Mdev] = {}
        for uuid in self._listdir(bus):
            link = bus / uuid
            if not link.is_dir():
                self._problem(link, "dangling link")
                continue
            # The link points into the parent's directory: .../<parent BDF>/<uuid>.
            parent = os.path.basename(os.path.dirname(os.path.realpath(link)))
            mdevs[uuid.lower()] = Mdev(
                uuid=uuid.lower(),
                parent=parent.lower(),
                type_id=self._link_name(link / "mdev_type") or "",
                iommu_group=self._group(link / "iommu_group"),
            )
        return mdevs

    def _iommu_groups(self) -> dict[int, frozenset[str]]:
        base = self.root / "kernel" / "iommu_groups"
        groups: dict[int, frozenset[str]] = {}
        for name in self._listdir(base):
            if name.isdigit():
                members = self._listdir(base / name / "devices")
                groups[int(name)] = frozenset(member.lower() for member in members)
        return groups
