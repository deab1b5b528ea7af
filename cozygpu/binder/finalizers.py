"""The class and device finalizers (R-BIND-9): always on, with GPU enabled or not.

Contract:
- Every GPUClass carries ``keys.CLASS_FINALIZER`` (the class-protection
  policy relies on it to freeze what the class sells). It is released only
  when the class is being deleted and no device *holds* it (Bound or Lost:
  what counts against budgets); a Pending order does not hold it, and the
  class-deleting policy refuses new ones.
- Every GPUDevice carries ``keys.DEVICE_FINALIZER``, so a released device
  keeps its binding and usage record while a VMI still uses it. It is
  released only when the device is being deleted and no VMI uses it: no
  attachment, or the attached VMI is gone (absent, or a VMI of the same name
  with another UID). While the VMI kind is not served an attachment is a
  gap in discovery, not an absent VMI, so the finalizer stays (R-BIND-7).
- A finalizer is never added to an object being deleted (the API server
  refuses it).
- Deciding is pure (``*_changes`` take raw objects as the cache holds them);
  ``apply_finalizers`` writes each change as a merge patch of
  ``metadata.finalizers`` preconditioned on the resourceVersion it was
  decided on, so a change never drops a finalizer someone added since. A
  Conflict or a vanished object is counted and left to the next pass.
- The binder's finalizers work decides object by object (``judge_device``,
  ``judge_class``), keyed (``Key``): a device when its event comes, and the
  classes it started or stopped holding (``keys_of_device_event``); the
  deleting devices attached to a VMI when that VMI's event comes (only those
  can be kept by a VMI); a class when its event comes; everything at a
  term's start. Judged one by one, they give what the ``*_changes``
  functions give over everything (a property test holds them to it).
- A deleting device attached by the VMI webhook before its VMI existed (no
  VMI UID recorded) keeps its finalizer until the attachment grace after
  ``attachedAt``, VMI seen or not: the replica's VMI watch may not show the
  VMI yet, and releasing the finalizer then deletes a device a VM is
  starting with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import attrs

from cozygpu import keys
from cozygpu.api import devices, meta
from cozygpu.binder.patcher import Write
from cozygpu.kube import resource_path
from cozygpu.views import specs

Obj = Mapping[str, Any]
HOLDING_PHASES = devices.HOLDING_PHASES
#: The device holds its class: accepted by the binder (Bound or Lost).
holds = devices.holds
_class_name = devices.class_name
_device_key = meta.key


@attrs.frozen(kw_only=True)
class FinalizerChange:
    plural: str
    namespace: str | None
    name: str
    resource_version: str
    #: The whole new ``metadata.finalizers`` list.
    finalizers: tuple[str, ...]
    finalizer: str
    add: bool

    @property
    def path(self) -> str:
        return resource_path(keys.GROUP, keys.VERSION, self.plural, namespace=self.namespace, name=self.name)


def _change(obj: Obj, plural: str, finalizer: str, *, keep: bool) -> FinalizerChange | None:
    """The change that makes ``finalizer`` present (``keep``) or absent on ``obj``, if any."""
    current = meta.finalizers(obj)
    if keep == (finalizer in current) or (keep and meta.deleting(obj)):
        return None
    new = (*current, finalizer) if keep else tuple(f for f in current if f != finalizer)
    namespace, name = meta.key(obj)
    return FinalizerChange(plural=plural, namespace=namespace or None, name=name,
                           resource_version=meta.resource_version(obj), finalizers=new, finalizer=finalizer, add=keep)


def class_finalizer_changes(classes: Iterable[Obj], devices: Iterable[Obj]) -> tuple[FinalizerChange, ...]:
    held = {_class_name(d) for d in devices if holds(d)}
    return class_changes_held(classes, held.__contains__)


def vmi_uids(vmis: Iterable[Obj]) -> dict[tuple[str, str], str]:
    """(namespace, name) -> UID of the VMIs that exist."""
    return {meta.key(v): meta.uid(v) for v in vmis}


def in_use(device: Obj, vmis: Mapping[tuple[str, str], str] | None, *, now: datetime | None = None,
           grace: timedelta | None = None) -> bool:
    """A VMI uses the device; with ``vmis`` None (kind not served) every attachment counts as in use.

    An attachment with no VMI UID recorded was made by the VMI webhook before its VMI existed: with ``now``
    and ``grace`` it counts as in use until the attachment grace after ``attachedAt`` is over, VMI seen or
    not (this replica's VMI watch may not show the VMI yet; the attachments work clears an attachment whose
    VMI never came)."""
    vmi = devices.attachment_vmi(device)
    if not vmi:
        return False
    if vmis is None:
        return True
    uid = vmis.get((meta.namespace(device), vmi))
    recorded = devices.attachment_uid(device)
    if uid is not None and (not recorded or recorded == uid):
        return True
    return not recorded and (until := unproven_until(device, grace)) is not None and now is not None and now < until


def unproven_until(device: Obj, grace: timedelta | None) -> datetime | None:
    """When an attachment with no VMI UID recorded stops counting as in use for want of its VMI (None: it
    has a UID, or no time, or no grace is given)."""
    at = devices.attached_at(device)
    if grace is None or at is None or devices.attachment_uid(device):
        return None
    return at + grace


def device_finalizer_changes(devices: Iterable[Obj], vmis: Mapping[tuple[str, str], str] | None, *,
                             now: datetime | None = None, grace: timedelta | None = None
                             ) -> tuple[FinalizerChange, ...]:
    """``vmis`` from :func:`vmi_uids`, or None while the VMI kind is not served; ``now`` and ``grace`` as
    :func:`in_use` takes them."""
    changes = []
    for device in devices:
        keep = not meta.deleting(device) or in_use(device, vmis, now=now, grace=grace)
        change = _change(device, keys.GPUDEVICE_PLURAL, keys.DEVICE_FINALIZER, keep=keep)
        if change is not None:
            changes.append(change)
    return tuple(changes)


def class_changes_held(classes: Iterable[Obj], held: Callable[[str], bool]) -> tuple[FinalizerChange, ...]:
    """:func:`class_finalizer_changes` with ``held(name)``: whether some device holds that class."""
    changes = []
    for gpu_class in classes:
        keep = not meta.deleting(gpu_class) or held(meta.name(gpu_class))
        change = _change(gpu_class, keys.GPUCLASS_PLURAL, keys.CLASS_FINALIZER, keep=keep)
        if change is not None:
            changes.append(change)
    return tuple(changes)


DeviceKey = tuple[str, str]


class VmiUids(Mapping[tuple[str, str], str]):
    """:func:`vmi_uids` read from a lookup as asked, not built over every VMI."""

    def __init__(self, lookup: Callable[[str, str], Obj | None], listed: Callable[[], Sequence[Obj]]) -> None:
        self._lookup, self._listed = lookup, listed

    def __getitem__(self, key: tuple[str, str]) -> str:
        found = self._lookup(*key)
        if found is None:
            raise KeyError(key)
        return meta.uid(found)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(vmi_uids(self._listed()))

    def __len__(self) -> int:
        return len(self._listed())


def _held_class(obj: Obj | None) -> str | None:
    if obj is None or not holds(obj):
        return None
    return _class_name(obj)


#: What the finalizers work looks at: ``(plural, namespace, name)`` of a GPUDevice, or of a GPUClass (namespace
#: "").
Key = tuple[str, str, str]


def device_key(namespace: str, name: str) -> Key:
    return (keys.GPUDEVICE_PLURAL, namespace, name)


def class_key(name: str) -> Key:
    return (keys.GPUCLASS_PLURAL, "", name)


def keys_of_device_event(old: Obj | None, new: Obj | None) -> list[Key]:
    """What a GPUDevice event (``old`` and ``new`` states, None: absent) asks to look at again: the device,
    and each class it started or stopped holding (a class's finalizer is released only once none holds it)."""
    either = new if new is not None else old
    if either is None:
        return []
    found = [device_key(*_device_key(either))]
    before, after = _held_class(old), _held_class(new)
    if before != after:
        found += [class_key(name) for name in (before, after) if name is not None]
    return found


@attrs.frozen
class Judged:
    """One object's finalizer change (None: none due), and in how many seconds to look at it again when
    nothing else happens (None: when an event says so)."""

    change: FinalizerChange | None
    again_in: float | None = None


def judge_device(device: Obj, vmis: Mapping[tuple[str, str], str] | None, *, now: datetime,
                 grace: timedelta) -> Judged:
    """The device finalizer's change on ``device`` (see the module contract); a deleting device kept only for
    an attachment whose VMI is not proven yet is looked at again when that ends."""
    deleting = meta.deleting(device)
    keep = not deleting or in_use(device, vmis, now=now, grace=grace)
    change = _change(device, keys.GPUDEVICE_PLURAL, keys.DEVICE_FINALIZER, keep=keep)
    until = unproven_until(device, grace) if deleting and keep else None
    return Judged(change, (until - now).total_seconds() if until is not None and until > now else None)


def judge_class(gpu_class: Obj, held: bool) -> Judged:
    """The class finalizer's change on ``gpu_class``; ``held``: some device holds it (Bound or Lost)."""
    keep = not meta.deleting(gpu_class) or held
    return Judged(_change(gpu_class, keys.GPUCLASS_PLURAL, keys.CLASS_FINALIZER, keep=keep))


def holding(devices: Iterable[Obj], class_name: str) -> bool:
    """Some of ``devices`` holds class ``class_name``."""
    return any(_held_class(device) == class_name for device in devices)


def finalizer_writes(changes: Sequence[FinalizerChange]) -> list[Write]:
    """The changes as the patcher's writes: a merge patch of ``metadata.finalizers`` on the resourceVersion
    the change was decided on; a release of an object already gone is done, anything else refused is
    requeued (``tag``: the change)."""
    kinds = {keys.GPUCLASS_PLURAL: specs.GPU_CLASSES, keys.GPUDEVICE_PLURAL: specs.GPU_DEVICES}
    return [Write(kind=kinds[c.plural], path=c.path, body={"metadata": {"finalizers": list(c.finalizers)}},
                  resource_version=c.resource_version, gone_is_done=not c.add, what=c.path, tag=c)
            for c in changes]
