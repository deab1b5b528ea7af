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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from cozygpu import keys
from cozygpu.base.logging import get_logger
from cozygpu.kube import Client, errors, resource_path

log = get_logger(__name__)

Obj = Mapping[str, Any]
HOLDING_PHASES = frozenset({"Bound", "Lost"})


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


@attrs.frozen(kw_only=True)
class FinalizerReport:
    applied: tuple[FinalizerChange, ...] = ()
    #: (plural, resourceVersion) the server answered each applied change with: for read-your-writes.
    versions: tuple[tuple[str, str], ...] = ()
    #: Changes refused by a Conflict or a vanished object: the next pass decides again.
    stale: tuple[FinalizerChange, ...] = ()

    @property
    def requeue(self) -> bool:
        return bool(self.stale)


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _status(obj: Obj) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _change(obj: Obj, plural: str, finalizer: str, *, keep: bool) -> FinalizerChange | None:
    """The change that makes ``finalizer`` present (``keep``) or absent on ``obj``, if any."""
    meta = _meta(obj)
    current = tuple(str(f) for f in meta.get("finalizers") or ())
    deleting = bool(meta.get("deletionTimestamp"))
    if keep == (finalizer in current) or (keep and deleting):
        return None
    new = (*current, finalizer) if keep else tuple(f for f in current if f != finalizer)
    return FinalizerChange(plural=plural, namespace=meta.get("namespace"), name=str(meta.get("name")),
                           resource_version=str(meta.get("resourceVersion")), finalizers=new,
                           finalizer=finalizer, add=keep)


def holds(device: Obj) -> bool:
    """The device holds its class: accepted by the binder (Bound or Lost)."""
    return _status(device).get("phase") in HOLDING_PHASES


def class_finalizer_changes(classes: Iterable[Obj], devices: Iterable[Obj]) -> tuple[FinalizerChange, ...]:
    held = {(d.get("spec") or {}).get("className") for d in devices if holds(d)}
    changes = []
    for gpu_class in classes:
        meta = _meta(gpu_class)
        keep = not meta.get("deletionTimestamp") or meta.get("name") in held
        change = _change(gpu_class, keys.GPUCLASS_PLURAL, keys.CLASS_FINALIZER, keep=keep)
        if change is not None:
            changes.append(change)
    return tuple(changes)


def vmi_uids(vmis: Iterable[Obj]) -> dict[tuple[str, str], str]:
    """(namespace, name) -> UID of the VMIs that exist."""
    return {(str(_meta(v).get("namespace")), str(_meta(v).get("name"))): str(_meta(v).get("uid") or "")
            for v in vmis}


def in_use(device: Obj, vmis: Mapping[tuple[str, str], str] | None) -> bool:
    """A VMI uses the device; with ``vmis`` None (kind not served) every attachment counts as in use."""
    attachment = _status(device).get("attachment")
    if not isinstance(attachment, Mapping) or not attachment.get("vmi"):
        return False
    if vmis is None:
        return True
    uid = vmis.get((str(_meta(device).get("namespace")), str(attachment["vmi"])))
    return uid is not None and (not attachment.get("uid") or attachment.get("uid") == uid)


def device_finalizer_changes(devices: Iterable[Obj], vmis: Mapping[tuple[str, str], str] | None
                             ) -> tuple[FinalizerChange, ...]:
    """``vmis`` from :func:`vmi_uids`, or None while the VMI kind is not served."""
    changes = []
    for device in devices:
        keep = not _meta(device).get("deletionTimestamp") or in_use(device, vmis)
        change = _change(device, keys.GPUDEVICE_PLURAL, keys.DEVICE_FINALIZER, keep=keep)
        if change is not None:
            changes.append(change)
    return tuple(changes)


async def apply_finalizers(client: Client, changes: Sequence[FinalizerChange]) -> FinalizerReport:
    applied: list[FinalizerChange] = []
    versions: list[tuple[str, str]] = []
    stale: list[FinalizerChange] = []
    for change in changes:
        patch = {"metadata": {"finalizers": list(change.finalizers)}}
        try:
            answer = await client.merge_patch(change.path, patch, resource_version=change.resource_version)
        except errors.NotFound:
            if not change.add:
                continue  # released already: the object is gone, which is what the release was for
            log.info("finalizer change stale, requeued", object=change.path, error="NotFound")
            stale.append(change)
            continue
        except errors.Conflict as error:
            log.info("finalizer change stale, requeued", object=change.path, error=type(error).__name__)
            stale.append(change)
            continue
        log.info("finalizer added" if change.add else "finalizer released", object=change.path,
                 finalizer=change.finalizer)
        applied.append(change)
        versions.append((change.plural, str((answer.get("metadata") or {}).get("resourceVersion") or "")))
    return FinalizerReport(applied=tuple(applied), versions=tuple(versions), stale=tuple(stale))
