"""The two coverage readers: which devices cover a launcher pod's GPU requests (R-MOD-6).

Why two, on purpose: a launcher pod requests the units its VMI's devices
already account for, so those units must not be counted a second time.
What "already accounted" means differs:

- for **budgets** every attached device that counts against budgets covers
  its pod: a Lost device still counts itself, so its VM's pod must not;
- for **node capacity** only a device holding units on the pod's own node
  (Bound there) covers it: a Lost device holds no units, so the running
  pod's GPUs must be counted on its node.

Merging them counts a Lost device twice (budgets) or not at all (capacity).
On a pod running on the node its devices are bound to, the readers differ
exactly on Lost devices. A device Bound on another node than the pod (a
migration target pod, or a set moved while its VM still runs) covers the
pod for budgets only, since the pod really uses units where it runs.

A third reader is for time, not for proof: the **launcher window**
(R-MOD-7). A launcher pod is bound to its node before virt-controller lists
it in ``activePods``, so for a moment it covers nothing. A pod whose
controller ownerReference names a VMI with devices attached and Bound on
the pod's node *claims* to be that launcher; for ``grace`` from its
creation :func:`window_covering` names those devices, and what they would
cover is kept apart from raw use (it keeps new orders off those units but
moves no hold). After the grace the claim is worth nothing: only
``activePods`` proves a launcher (R-MOD-5) — except while the pod is torn
down: its VMI gone from the view while a device is still attached to that
very VMI (its UID recorded, so the VMI was seen), the claim holds whatever
the pod's age. KubeVirt deletes the launcher before the VMI, but a replica's
pod watch may come back after its VMI watch (each reconnects on its own), so
the VMI's end can be seen first; counting the launcher as raw use then moved
another tenant's hold off a full node (the chaos test's "watches cut"). The
binder keeps such an attachment until no pod claims the VMI
(``binder.attachments``), so the claim ends with the pod.

Contract: each reader returns units per resource name; :func:`uncovered`
subtracts them from a pod's requests, never below zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from cozygpu.model.snapshot import DeviceView, GPUClassView, PodView, VMIView


def attached_to(device: DeviceView, vmi: VMIView) -> bool:
    """The device's attachment names this VMI (and, once known, this VMI's UID, not a previous one's)."""
    attachment = device.attachment
    if attachment is None or device.namespace != vmi.namespace or attachment.vmi != vmi.name:
        return False
    return not (attachment.uid and vmi.uid and attachment.uid != vmi.uid)


def budget_covering(devices: Iterable[DeviceView]) -> tuple[DeviceView, ...]:
    """Attached devices that cover their launcher pod for budgets: every one that counts itself."""
    return tuple(d for d in devices if d.attachment is not None and d.accepted)


def capacity_covering(devices: Iterable[DeviceView], *, pod_node: str | None) -> tuple[DeviceView, ...]:
    """Attached devices that cover their launcher pod for node capacity: Bound on the pod's node."""
    if not pod_node:
        return ()
    return tuple(d for d in devices if d.attachment is not None and d.holds_units and d.node_name == pod_node)


def window_covering(
    pod: PodView, claimed: Iterable[DeviceView], *, now: datetime, grace: timedelta, vmi_gone: bool = False
) -> tuple[tuple[DeviceView, ...], datetime | None]:
    """The devices an unproven launcher claims while its window runs, and when the window closes.

    ``claimed`` are the devices attached to the VMI of the pod's ownerReference (by name; the UID must
    match once the attachment has one). Only those Bound on the pod's node count. Nothing, and no
    deadline, for a pod that claims no VMI, has no node or creation time, or whose window is over. With
    ``vmi_gone`` (the claimed VMI is not in the view), the devices whose attachment recorded exactly the
    pod's VMI UID count whatever the pod's age, with no deadline: the launcher of a VMI seen ending.
    """
    if pod.claims_vmi is None or not pod.node_name or pod.created is None:
        return (), None
    name, uid = pod.claims_vmi
    closes: datetime | None = pod.created + grace
    if now >= pod.created + grace:
        if not vmi_gone or not uid:
            return (), None
        closes = None  # a VMI seen ending: only an attachment that recorded its very UID, and no deadline
    found = tuple(
        d for d in claimed
        if d.attachment is not None and d.namespace == pod.namespace and d.attachment.vmi == name
        and (d.attachment.uid == uid or (closes is not None and not d.attachment.uid))
        and d.holds_units and d.node_name == pod.node_name
    )
    return (found, closes) if found else ((), None)


def split_window(beyond: Mapping[str, int], window: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """Split a pod's uncovered use into (raw, window): the window takes at most what its devices cover."""
    raw: dict[str, int] = {}
    held: dict[str, int] = {}
    for name, amount in beyond.items():
        inside = min(amount, window.get(name, 0))
        if inside > 0:
            held[name] = inside
        if amount > inside:
            raw[name] = amount - inside
    return raw, held


def covered_units(devices: Iterable[DeviceView], classes: Mapping[str, GPUClassView]) -> dict[str, int]:
    """Units per resource name that the given devices account for."""
    units: dict[str, int] = {}
    for device in devices:
        gpu_class = classes.get(device.class_name)
        if gpu_class is None:
            continue
        units[gpu_class.resource_name] = units.get(gpu_class.resource_name, 0) + device.count
    return units


def uncovered(requests: Mapping[str, int], covered: Mapping[str, int]) -> dict[str, int]:
    """What a pod uses beyond what its devices account for, per resource name (zeros dropped)."""
    rest: dict[str, int] = {}
    for name, amount in requests.items():
        left = amount - covered.get(name, 0)
        if left > 0:
            rest[name] = left
    return rest
