"""Sets (R-BIND-4): the devices that move, go Lost and are rebound together, and whether their VM runs.

Why: the devices one VMI names (attached to it) serve one VM, so they must
sit on one node; an unattached device is a set of one. A ``Work`` is a set
as the planner reads it (member views, its VMI); a running launcher pins
the set to the launcher's node (R-BIND-7).
"""

from __future__ import annotations

import attrs

from cozygpu.model.coverage import attached_to
from cozygpu.model.snapshot import DeviceKey, DeviceView, Snapshot, VmiKey, VMIView


@attrs.frozen(kw_only=True)
class DeviceSet:
    """The devices that move, go Lost and are rebound together."""

    vmi: VmiKey | None
    members: tuple[DeviceKey, ...]

    @property
    def label(self) -> str:
        if self.vmi is not None:
            return f"VMI {self.vmi[0]}/{self.vmi[1]}"
        namespace, name = self.members[0]
        return f"GPUDevice {namespace}/{name}"


def device_sets(snapshot: Snapshot) -> tuple[DeviceSet, ...]:
    """Every set in the snapshot, sorted by key: one per attached VMI, one per unattached device."""
    sets: list[DeviceSet] = []
    for vmi_key, members in snapshot.devices_by_vmi.items():
        vmi = snapshot.vmis.get(vmi_key)
        # A member attached to an earlier VMI of the same name (another UID) is not this
        # VMI's: it stands alone, like an unattached device, rather than drop out of every set.
        current = [k for k in members if vmi is None or attached_to(snapshot.devices[k], vmi)]
        if current:
            sets.append(DeviceSet(vmi=vmi_key, members=tuple(sorted(current))))
        sets.extend(DeviceSet(vmi=None, members=(k,)) for k in sorted(set(members) - set(current)))
    for key, device in snapshot.devices.items():
        if device.attachment is None:
            sets.append(DeviceSet(vmi=None, members=(key,)))
    sets.sort(key=lambda s: (s.vmi or s.members[0], s.vmi is None))
    return tuple(sets)


@attrs.define
class Work:
    """A set being planned: its members as views, its VMI if known."""

    label: str
    vmi: VMIView | None
    members: list[DeviceView]


def work_of(snapshot: Snapshot, device_set: DeviceSet) -> Work:
    members = [snapshot.devices[k] for k in device_set.members]
    vmi = snapshot.vmis.get(device_set.vmi) if device_set.vmi is not None else None
    return Work(label=device_set.label, vmi=vmi, members=members)


def running(snapshot: Snapshot, work: Work) -> bool:
    """Whether the set's VMI has a launcher pod that has not finished (R-BIND-7)."""
    if work.vmi is None:
        return False
    return any((pod := snapshot.pods.get(uid)) is not None and not pod.final for uid in work.vmi.active_pods)


def launcher_node(snapshot: Snapshot, work: Work) -> str | None:
    """The node of the set's running launcher pod (the first by uid), None when it has none yet."""
    if work.vmi is None:
        return None
    for uid in sorted(work.vmi.active_pods):
        pod = snapshot.pods.get(uid)
        if pod is not None and not pod.final and pod.node_name:
            return pod.node_name
    return None
