"""The effective set of GPU resource names (R-MOD-9).

Why: a resource name is a "GPU name" for the raw-name policy, for raw quota
keys and for the VMI webhook's search for a VMI's own GPU entries. If a name
that only KubeVirt's permittedHostDevices table carries were left out, then
under ``rawNames: forbid`` a VM or pod could request it directly, and the
webhook would take it for a non-GPU host device.

Contract:
- effective = the hoster's list (flag) | every class's resourceName | every
  GPUNode's ``status.resourceNames`` | the NVIDIA (vendor 10DE) PCI entries
  and all mediated entries of ``permittedHostDevices``. A PCI entry of
  another vendor (a ConnectX VF) stays out.
- Names in our own domain (``gpu.cozystack.io/...``) are never resource
  names: they would read as budget keys.
- Whether a class's resourceName is permitted at all is checked against
  every PCI and mediated entry; with no table configured KubeVirt checks
  nothing and neither do we.
"""

from __future__ import annotations

from collections.abc import Iterable

from cozygpu import keys
from cozygpu.model import refusals
from cozygpu.model.refusals import Refusal
from cozygpu.model.snapshot import GPUClassView, NodeInventory, PermittedHostDevices

NVIDIA_VENDOR_ID = "10de"


def pci_vendor(selector: str) -> str:
    """The vendor half of a ``VVVV:DDDD`` pciVendorSelector, lower-cased."""
    return selector.partition(":")[0].strip().lower()


def permitted_gpu_names(permitted: PermittedHostDevices | None) -> frozenset[str]:
    """The NVIDIA PCI entries and every mediated entry: the table's GPU names."""
    if permitted is None:
        return frozenset()
    names = {e.resource_name for e in permitted.pci if pci_vendor(e.selector) == NVIDIA_VENDOR_ID}
    names.update(e.resource_name for e in permitted.mediated)
    return frozenset(n for n in names if n)


def permitted_names(permitted: PermittedHostDevices | None) -> frozenset[str]:
    """Every PCI and mediated entry, whatever the vendor: what KubeVirt lets a launcher request."""
    if permitted is None:
        return frozenset()
    names = {e.resource_name for e in permitted.pci} | {e.resource_name for e in permitted.mediated}
    return frozenset(n for n in names if n)


def effective_names(
    *,
    hoster: Iterable[str] = (),
    classes: Iterable[GPUClassView] = (),
    inventories: Iterable[NodeInventory] = (),
    permitted: PermittedHostDevices | None = None,
) -> frozenset[str]:
    names = set(hoster)
    names.update(c.resource_name for c in classes)
    for inventory in inventories:
        names.update(inventory.resource_names)
    names.update(permitted_gpu_names(permitted))
    return frozenset(n for n in names if n and not n.startswith(keys.QUOTA_PREFIX))


def class_permission_problem(gpu_class: GPUClassView, permitted: PermittedHostDevices | None) -> Refusal | None:
    """A class whose resourceName KubeVirt would not let a launcher pod request."""
    if permitted is None or gpu_class.resource_name in permitted_names(permitted):
        return None
    return refusals.class_not_permitted(gpu_class.name, gpu_class.resource_name)
