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
- ``FinalizerWork`` decides from what changed, not from the fleet: the
  devices whose events came in since its last run, every device being
  deleted when a VMI moved (only those can be kept by a VMI), and the classes
  held, counted as device events come in. It gives what the ``*_changes``
  functions give over everything (a property test holds it to them), and
  looks at everything again after a start, a store replaced or a refused
  write.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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


def in_use(device: Obj, vmis: Mapping[tuple[str, str], str] | None) -> bool:
    """A VMI uses the device; with ``vmis`` None (kind not served) every attachment counts as in use."""
    vmi = devices.attachment_vmi(device)
    if not vmi:
        return False
    if vmis is None:
        return True
    uid = vmis.get((meta.namespace(device), vmi))
    recorded = devices.attachment_uid(device)
    return uid is not None and (not recorded or recorded == uid)


def device_finalizer_changes(devices: Iterable[Obj], vmis: Mapping[tuple[str, str], str] | None
                             ) -> tuple[FinalizerChange, ...]:
    """``vmis`` from :func:`vmi_uids`, or None while the VMI kind is not served."""
    changes = []
    for device in devices:
        keep = not meta.deleting(device) or in_use(device, vmis)
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


class FinalizerWork:
    """What the finalizers must look at again, kept from the cache's events (see the module docstring).

    Feed it every GPUDevice event (``device``) and every VMI event (``vmi``);
    ``changes`` then decides over what moved, and ``done`` says whether its
    writes all went through (if not, the next run looks at everything).
    """

    def __init__(self) -> None:
        self._everything = True
        self._devices: set[DeviceKey] = set()
        #: Devices being deleted: a VMI's change may keep or release their finalizer.
        self._deleting: set[DeviceKey] = set()
        self._vmis_moved = False
        #: Class name -> devices that hold it (Bound or Lost), as the events have them.
        self._held: Counter[str] = Counter()
        #: The last ``changes`` were not all written (or not yet): the next run looks at everything.
        self._unfinished = False

    def everything(self) -> None:
        """Look at every device and class next time (a start, a store replaced, a refused write)."""
        self._everything = True

    def device(self, old: Obj | None, new: Obj | None) -> None:
        """A GPUDevice event: ``old`` and ``new`` states (None: absent)."""
        either = new if new is not None else old
        if either is None:
            return
        key = _device_key(either)
        self._devices.add(key)
        if new is not None and meta.deleting(new):
            self._deleting.add(key)
        else:
            self._deleting.discard(key)
        before, after = _held_class(old), _held_class(new)
        if before != after:
            if before is not None:
                self._held[before] -= 1
                if self._held[before] <= 0:
                    del self._held[before]
            if after is not None:
                self._held[after] += 1

    def vmi(self) -> None:
        """A VMI event: the devices being deleted are looked at again."""
        self._vmis_moved = True

    def changes(self, classes: Iterable[Obj], devices: Callable[[], Iterable[Obj]],
                device: Callable[[str, str], Obj | None], vmis: Mapping[tuple[str, str], str] | None,
                assumed: Iterable[Obj] = ()) -> tuple[FinalizerChange, ...]:
        """The finalizer changes due now: ``devices()`` lists every device as the cache has it (the events
        that follow are relative to it; read only when everything is looked at), ``device(namespace, name)``
        reads one as the binder last knows it (its own writes assumed: the version a change is made on),
        ``vmis`` as :func:`device_finalizer_changes` takes it, and ``assumed`` the binder's own writes the
        cache has not shown yet (their classes held too)."""
        everything, self._everything, self._unfinished = self._everything or self._unfinished, False, True
        changed, self._devices = self._devices, set()
        moved, self._vmis_moved = self._vmis_moved, False
        if everything:
            listed = list(devices())
            self._held = Counter(c for d in listed if (c := _held_class(d)) is not None)
            self._deleting = {_device_key(d) for d in listed if meta.deleting(d)}
            looked: Iterable[Obj] = [found for d in listed if (found := device(*_device_key(d))) is not None]
        else:
            looked = [found for key in sorted(changed | (self._deleting if moved else set()))
                      if (found := device(*key)) is not None]
        also = {c for d in assumed if (c := _held_class(d)) is not None}
        return (*class_changes_held(classes, lambda name: name in self._held or name in also),
                *device_finalizer_changes(looked, vmis))

    def done(self, *, stale: bool) -> None:
        """The last ``changes`` were written (``stale``: some were refused, so look at everything next).
        Events that came in meanwhile are kept for the next run."""
        self._unfinished = stale


def finalizer_writes(changes: Sequence[FinalizerChange]) -> list[Write]:
    """The changes as the patcher's writes: a merge patch of ``metadata.finalizers`` on the resourceVersion
    the change was decided on; a release of an object already gone is done, anything else refused is
    requeued (``tag``: the change)."""
    kinds = {keys.GPUCLASS_PLURAL: specs.GPU_CLASSES, keys.GPUDEVICE_PLURAL: specs.GPU_DEVICES}
    return [Write(kind=kinds[c.plural], path=c.path, body={"metadata": {"finalizers": list(c.finalizers)}},
                  resource_version=c.resource_version, gone_is_done=not c.add, what=c.path, tag=c)
            for c in changes]
