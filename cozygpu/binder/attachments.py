"""Attachments that outlived their VMI, and template devices that go with theirs (R-BIND-7, R-BIND-8).

Contract (decided on the model's Snapshot, pure; ``attachment_writes`` are its writes):
- An attachment is **kept** while its VMI exists (same name, and the same UID
  when the attachment knows one), and always while that VMI has a running
  launcher pod (``status.activePods`` naming a Running pod: the only proof,
  R-MOD-5). A pass never detaches a running VM's device.
- It is **cleared** (``status.attachment`` removed, the hold stays: phase and
  node are not touched) when its VMI is gone — the attachment knew the VMI's
  UID, no VMI of that UID exists and no pod not finished claims it (its
  launcher, torn down first, may be seen after the VMI's end) — or when no VMI of that name appeared
  within the attachment grace after ``attachedAt`` (an attachment without a
  time is judged from now on: it is never cleared on the pass that first
  sees it).
- The VMI's UID is **recorded** on an attachment that has none (the VMI
  webhook attaches before the VMI exists, so it cannot know it) once a VMI of
  that name exists: from then on the VMI's deletion is seen at once (VMI
  gone) instead of after the grace, and a later VMI of the same name is not
  taken for it.
- A **template device** (the template-device label) is deleted, not
  cleared, where its attachment would be cleared: it lives and dies with its
  VMI.
- A device being deleted is left alone: its finalizer waits for the VMI
  (R-BIND-9).
- While the VMI kind is not served (KubeVirt not installed yet, or its CRD
  gone) nothing can be proven absent: every attached device is
  **unverified**, nothing is cleared or deleted, and the binder fails its
  pass (``AttachmentsUnverified``) rather than detach — a gap in discovery,
  not an absent VMI.
- Each device is judged on its own (``judge``): its writes, and when to
  judge it again if nothing changes (an attachment waiting for its VMI, when
  its grace ends). The binder's attachments work judges the devices whose
  device, VMI or launcher pods changed (the model's change log), keyed.
- Every write carries the resourceVersion of the object it was decided on:
  the clear is a merge patch of the status subresource, the deletion has a
  resourceVersion precondition. A Conflict or a vanished object is left to
  the next pass, never retried blindly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from cozygpu import keys
from cozygpu.binder.patcher import Verb, Write, version_of
from cozygpu.kube import resource_path
from cozygpu.model.snapshot import DeviceKey, DeviceView, PodPhase, Snapshot
from cozygpu.views import specs

Obj = Mapping[str, Any]

#: Why an attachment is cleared (also the log's and the metric's reason).
VMI_GONE = "VMIGone"
VMI_NEVER_APPEARED = "VMINeverAppeared"


class AttachmentsUnverified(Exception):
    """Devices are attached while the VMI kind is not served: the pass must not decide their fate."""

    def __init__(self, devices: Sequence[DeviceKey]) -> None:
        self.devices = tuple(devices)
        shown = ", ".join(f"{ns}/{name}" for ns, name in self.devices[:5])
        more = f" and {len(self.devices) - 5} more" if len(self.devices) > 5 else ""
        super().__init__(
            f"{len(self.devices)} GPUDevice(s) attached ({shown}{more}) while "
            f"virtualmachineinstances.kubevirt.io is not served: nothing is detached until it is")


@attrs.frozen(kw_only=True)
class Detach:
    """Clear one device's attachment, or delete the device when it is a template device."""

    device: DeviceKey
    vmi: str
    reason: str
    delete: bool

    @property
    def message(self) -> str:
        namespace, name = self.device
        what = "deleted with its VMI" if self.delete else "attachment cleared, the hold stays"
        why = "is gone" if self.reason == VMI_GONE else "never appeared within the attachment grace"
        return f"GPUDevice {namespace}/{name}: VMI {namespace}/{self.vmi} {why}; {what}"


@attrs.frozen(kw_only=True)
class Adopt:
    """Record the UID of the VMI an attachment names, now that the VMI exists."""

    device: DeviceKey
    vmi: str
    uid: str


@attrs.frozen(kw_only=True)
class AttachmentPlan:
    detaches: tuple[Detach, ...] = ()
    adopts: tuple[Adopt, ...] = ()
    #: Attached devices whose VMI cannot be looked up (the VMI kind is not served).
    unverified: tuple[DeviceKey, ...] = ()


def running_launcher(snapshot: Snapshot, device: DeviceView) -> bool:
    """Whether the device's VMI lists a Running pod in ``status.activePods``."""
    key = device.vmi_key
    vmi = snapshot.vmis.get(key) if key is not None else None
    if vmi is None:
        return False
    for uid in vmi.active_pods:
        pod = snapshot.pods.get(uid)
        if pod is not None and pod.phase is PodPhase.RUNNING:
            return True
    return False


def claimed_vmis(snapshot: Snapshot) -> frozenset[tuple[str, str, str]]:
    """(namespace, VMI name, VMI UID) of every pod not finished that claims a VMI (its ownerReference)."""
    return frozenset((pod.namespace, *pod.claims_vmi) for pod in snapshot.pods.values()
                     if pod.claims_vmi is not None and not pod.final)


def _why_detach(snapshot: Snapshot, device: DeviceView, *, grace: timedelta, first_seen: datetime,
                claimed: Callable[[], frozenset[tuple[str, str, str]]]) -> str | None:
    attachment = device.attachment
    if attachment is None:
        return None
    vmi = snapshot.vmis.get((device.namespace, attachment.vmi))
    if vmi is not None and (not attachment.uid or not vmi.uid or vmi.uid == attachment.uid):
        return None
    if running_launcher(snapshot, device):
        return None
    if attachment.uid:
        # The VMI was seen once (its UID was recorded) and no longer exists. Its launcher goes first, but this
        # replica's pod watch may show that later than the VMI's end: while a pod still claims that VMI the
        # attachment stays, so the launcher counts as the hold's, not as someone's raw use (model.coverage).
        if (device.namespace, attachment.vmi, attachment.uid) in claimed():
            return None
        return VMI_GONE
    since = attachment.attached_at or first_seen
    if vmi is None and snapshot.now - since < grace:
        return None
    return VMI_NEVER_APPEARED if vmi is None else VMI_GONE


def attached_devices(snapshot: Snapshot, among: Iterable[DeviceKey] | None = None) -> list[DeviceView]:
    """The attached devices (``among``: of those keys only), from the model's index by VMI."""
    if among is None:
        return [d for keys_ in snapshot.devices_by_vmi.values() for k in keys_
                if (d := snapshot.devices[k]).attachment is not None]
    return [found for k in among if (found := snapshot.devices.get(k)) is not None and found.attachment is not None]


@attrs.frozen(kw_only=True)
class Judged:
    """One attached device's verdict: what to write (at most one detach or adopt), and in how many seconds
    to judge it again when nothing else happens (None: when its device, VMI or launcher changes)."""

    plan: AttachmentPlan = AttachmentPlan()
    again_in: float | None = None


def judge(snapshot: Snapshot, device: DeviceView, *, grace: timedelta, first_seen: datetime | None = None,
          claimed: Callable[[], frozenset[tuple[str, str, str]]] | None = None) -> Judged:
    """One device's attachment (see the module contract). ``first_seen``: for an attachment without
    ``attachedAt``, when the binder first saw it (default: now, so it waits a whole grace); ``claimed``:
    ``claimed_vmis`` of the snapshot, memoised by the caller across devices."""
    attachment = device.attachment
    if attachment is None or device.deleting:
        return Judged()  # a deleting device is the finalizer's to judge (R-BIND-9)
    if claimed is None:
        claimed = functools.cache(functools.partial(claimed_vmis, snapshot))
    seen = first_seen or snapshot.now
    why = _why_detach(snapshot, device, grace=grace, first_seen=seen, claimed=claimed)
    if why is not None:
        return Judged(plan=AttachmentPlan(detaches=(
            Detach(device=device.key, vmi=attachment.vmi, reason=why, delete=device.template),)))
    vmi = snapshot.vmis.get((device.namespace, attachment.vmi))
    if not attachment.uid and vmi is not None and vmi.uid:
        return Judged(plan=AttachmentPlan(adopts=(Adopt(device=device.key, vmi=attachment.vmi, uid=vmi.uid),)))
    if vmi is None and not attachment.uid:  # waiting for its VMI: cleared when the grace ends, if it never came
        since = attachment.attached_at or seen
        return Judged(again_in=max((since + grace - snapshot.now).total_seconds(), 0.0))
    return Judged()


def plan_attachments(snapshot: Snapshot, *, vmis_served: bool, grace: timedelta,
                     first_seen: Mapping[DeviceKey, datetime] | None = None,
                     skip: Iterable[DeviceKey] = (), attached: Sequence[DeviceView] | None = None) -> AttachmentPlan:
    """What to detach in ``snapshot``: ``judge`` of each attached device (every one, or ``attached``),
    but those in ``skip`` (written by this pass already: their view is stale). While VMIs are not served,
    every one is unverified."""
    if attached is None:
        attached = attached_devices(snapshot)
    if not vmis_served:
        return AttachmentPlan(unverified=tuple(sorted(d.key for d in attached)))
    skipped = set(skip)
    seen = first_seen or {}
    detaches: list[Detach] = []
    adopts: list[Adopt] = []
    # One walk of the pods a pass, and only when an attachment's VMI is gone.
    claimed = functools.cache(functools.partial(claimed_vmis, snapshot))
    for device in sorted(attached, key=lambda d: d.key):
        if device.key in skipped:
            continue
        plan = judge(snapshot, device, grace=grace, first_seen=seen.get(device.key), claimed=claimed).plan
        detaches += plan.detaches
        adopts += plan.adopts
    return AttachmentPlan(detaches=tuple(detaches), adopts=tuple(adopts))


def _path(key: DeviceKey, *, subresource: str | None = None) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=key[0], name=key[1],
                         subresource=subresource)


def attachment_writes(plan: AttachmentPlan, objects: Mapping[DeviceKey, Obj]) -> list[Write]:
    """``plan``'s adopted UIDs, then its detaches, as the patcher's writes, each on the resourceVersion of
    its device in ``objects`` (``tag``: the ``Adopt`` or ``Detach``); a device gone meanwhile is skipped.
    A detach that deletes answers with the device, now deleting (its finalizer keeps it)."""
    writes: list[Write] = []
    for adopt in plan.adopts:
        if (obj := objects.get(adopt.device)) is not None:
            writes.append(Write(kind=specs.GPU_DEVICES, path=_path(adopt.device, subresource="status"),
                                body={"status": {"attachment": {"uid": adopt.uid}}}, resource_version=version_of(obj),
                                what="/".join(adopt.device), tag=adopt))
    for detach in plan.detaches:
        if (obj := objects.get(detach.device)) is None:
            continue
        if detach.delete:
            writes.append(Write(kind=specs.GPU_DEVICES, path=_path(detach.device), verb=Verb.DELETE,
                                resource_version=version_of(obj), what="/".join(detach.device), tag=detach))
        else:
            writes.append(Write(kind=specs.GPU_DEVICES, path=_path(detach.device, subresource="status"),
                                body={"status": {"attachment": None}}, resource_version=version_of(obj),
                                what="/".join(detach.device), tag=detach))
    return writes
