"""Hold claims (SPEC §1.5): each Bound device of a DRA-sourced class holds its devices as a ResourceClaim.

Why: kube-scheduler counts a device as taken for every other pod only while
some claim's allocation names it. A launcher's own claim is released when the
pod goes; the hold claim is allocated by the binder itself and reserved for
the GPUDevice, so the resourceclaim controller leaves it alone while the VM
is off (verified with the real components, ``tests/devcluster/test_dra_plane.py``).

Contract:
- ``device_plan`` is pure and plans one device (a hold claim is named after
  its GPUDevice, so a device key names both): from the snapshot and the DRA
  tracker of the same instant (``LiveSnapshot.dra``) it returns
  ``model.dra_claims.claim_plan``'s step for that device (a claim under a VM,
  ``in_use``, is never moved), or the release of its hold claim when the
  device no longer holds (deleted, unless a VMI it is attached to still
  exists: R-BIND-7). What it costs is the device's node's units, not the
  fleet: a unit is free when no claim's allocation holds it (the tracker's
  ``first``; the device's own claim's units are free to itself) and no
  device planned before it in the same pass chose it (``chosen``), so two
  holds on one node never share a device whatever order they are judged in.
- ``keys_changed`` names the devices whose plan may have moved since the
  model's change log's ``changes`` (None: every DRA hold and hold claim).
- A hold claim is the device's own when its controller reference is that
  GPUDevice (``ClaimView.holder``); a claim of another owner that happens to
  carry the device's name is someone else's and is never written.
- Writes, each preconditioned on the resourceVersion it was decided on:
  create (no precondition: AlreadyExists if another replica won), then the
  allocation as a merge patch of ``status`` on the version the create
  returned or the cache held; a set that moved is deallocated first (the
  allocation is immutable once written) and allocated on the version that
  answer returned. The chained write is built from the answer of the one
  before (``allocations_after``), so one pass carries a claim from nothing to
  allocated.
- A ``Short`` step writes nothing: the node serves less than the hold holds
  (someone else's claim took a device), which the read model already shows as
  capacity lost, and placement moves or loses the set (R-BIND-5).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from datetime import datetime
from typing import Any, Final

import attrs

from cozygpu.api import claims as claims_api
from cozygpu.api import meta
from cozygpu.binder.patcher import Verb, Write
from cozygpu.binder.reconciler import devices_touched
from cozygpu.kube import resource_path
from cozygpu.model.dra import DeviceRef, DraUnits
from cozygpu.model.dra_claims import ClaimAction, ClaimStep, claim_plan
from cozygpu.model.dra_tracker import DraTracker
from cozygpu.model.snapshot import Changes, DeviceKey, DeviceView, Snapshot
from cozygpu.views import specs

Obj = Mapping[str, Any]


def claim_path(namespace: str, name: str | None = None, *, status: bool = False) -> str:
    return resource_path(claims_api.API_GROUP, claims_api.API_VERSION, "resourceclaims", namespace=namespace,
                         name=name, subresource="status" if status else None)


@attrs.frozen(kw_only=True)
class ClaimsPlan:
    steps: tuple[ClaimStep, ...] = ()
    #: Hold claims whose device holds nothing any more, to delete.
    release: tuple[DeviceKey, ...] = ()


def in_use(snapshot: Snapshot, key: DeviceKey) -> bool:
    """Whether the device is attached to a VMI that exists: its claim is what its launcher runs on (R-BIND-7)."""
    device = snapshot.devices.get(key)
    vmi = device.vmi_key if device is not None else None
    return vmi is not None and vmi in snapshot.vmis


def device_plan(snapshot: Snapshot, dra: DraTracker, key: DeviceKey,
                chosen: MutableMapping[DeviceRef, DeviceKey] | None = None) -> ClaimsPlan:
    """What device ``key``'s hold claim needs (see the module docstring). ``chosen``: the units the devices
    planned before it in this pass chose, by unit (this device's choice is added)."""
    found = dra.claims.get(key)
    own = found if found is not None and found.is_hold else None
    if not _holds(snapshot, key):
        release = own is not None and not in_use(snapshot, key)
        return ClaimsPlan(release=(key,) if release else ())
    device = snapshot.devices[key]
    node, gpu_class = device.node_name, snapshot.classes[device.class_name]
    assert node is not None
    if own is not None and own.allocated and own.node == node and len(own.allocated) == device.count:
        return ClaimsPlan()  # holds what it should (``claim_plan`` leaves it alone too)
    taken = chosen if chosen is not None else {}

    def free(ref: DeviceRef) -> bool:
        holder = dra.first(ref)
        if holder is not None and (own is None or (holder.namespace, holder.name) != key):
            return False  # someone else's claim, or another hold, holds it
        return taken.get(ref, key) == key

    # Only the device's node's units of its offer, without those held or chosen: ``claim_plan`` then sees
    # what a plan over every hold would have left for this one.
    units: dict[str, DraUnits] = {}
    offer = dra.units.get(gpu_class.resource_name)
    if offer is not None:
        units[gpu_class.resource_name] = attrs.evolve(
            offer, by_node={node: tuple(ref for ref in offer.by_node.get(node, ()) if free(ref))})
    steps = claim_plan([device], snapshot.classes, {key: own} if own is not None else {}, units, dra.attrs_of,
                       in_use=(key,) if in_use(snapshot, key) else ())
    for step in steps:
        for ref in step.devices:
            taken[ref] = key
    return ClaimsPlan(steps=tuple(steps))


def keys_changed(snapshot: Snapshot, changes: Changes | None, dra: DraTracker) -> list[DeviceKey]:
    """The devices whose hold claim may need a write since the model's change log's ``changes`` (None: every
    device of a DRA class that holds units, and every hold claim's device).

    A device the log names, or one attached to a VMI it names (a VM stopping lets a set move, R-BIND-7), and
    the devices on the nodes it names: a claim that took or freed one of a node's units touches that node (a
    hold short of units may have them now). Only those with something to hold or release are named.
    """
    if changes is None:
        found = {key for key, device in snapshot.devices.items()
                 if device.holds_units and snapshot.sells_dra(device.class_name)}
        found.update(key for key, claim in dra.claims.items() if claim.is_hold)
        return sorted(found)
    by_node = snapshot.devices_by_node
    touched = devices_touched(snapshot, changes)
    touched.update(key for node in changes.nodes for key in by_node.get(node, ()))
    return sorted(key for key in touched if _holds(snapshot, key) or _own(dra, key))


def _holds(snapshot: Snapshot, key: DeviceKey) -> bool:
    device = snapshot.devices.get(key)
    return device is not None and device.holds_units and snapshot.sells_dra(device.class_name)


def _own(dra: DraTracker, key: DeviceKey) -> bool:
    claim = dra.claims.get(key)
    return claim is not None and claim.is_hold


#: A deallocation's status patch. What the driver reported of the devices (``status.devices``, GA in 1.37) goes
#: with them: the API server drops a deallocated device's status itself (as kube-scheduler's deallocation expects).
DEALLOCATED: Final[Mapping[str, None]] = {"allocation": None, "reservedFor": None}


def _status_write(namespace: str, name: str, status: Mapping[str, Any] | None, version: str, what: str,
                  tag: Any) -> Write:
    return Write(kind=specs.RESOURCE_CLAIMS, path=claim_path(namespace, name, status=True), verb=Verb.PATCH,
                 body={"status": status if status is not None else DEALLOCATED},
                 resource_version=version, what=what, tag=tag)


def first_writes(plan: ClaimsPlan, snapshot: Snapshot, claims: Mapping[DeviceKey, Obj]) -> list[Write]:
    """The first write of each step (a create, a deallocation, or the allocation itself), and the releases.

    ``claims``: the hold claims' objects as the cache holds them, by key (their resourceVersions). A step
    whose next write follows from this one's answer carries itself as the write's ``tag``.
    """
    writes: list[Write] = []
    for step in plan.steps:
        namespace, name = step.device
        device = snapshot.devices[step.device]
        what = f"ResourceClaim {namespace}/{name}"
        if step.action is ClaimAction.CREATE:
            gpu_class = snapshot.classes[device.class_name]
            assert gpu_class.dra is not None
            body = claims_api.hold_claim(name, device.uid, device_class=gpu_class.dra.device_class,
                                         count=device.count, selectors=gpu_class.dra.selectors,
                                         match_attribute=gpu_class.dra.match_attribute)
            writes.append(Write(kind=specs.RESOURCE_CLAIMS, path=claim_path(namespace), verb=Verb.CREATE, body=body,
                                what=what, tag=step))
        elif step.action is ClaimAction.ALLOCATE:
            writes.append(allocation(step, device, meta.resource_version(claims.get(step.device)), snapshot.now))
        elif step.action is ClaimAction.REALLOCATE:
            writes.append(_status_write(namespace, name, None, meta.resource_version(claims.get(step.device)),
                                        f"{what} (deallocated: its set moved)", step))
    for key in plan.release:
        writes.append(Write(kind=specs.RESOURCE_CLAIMS, path=claim_path(*key), verb=Verb.DELETE,
                            resource_version=meta.resource_version(claims.get(key)) or None, gone_is_done=True,
                            what=f"ResourceClaim {key[0]}/{key[1]} (its device holds nothing)"))
    return writes


@attrs.frozen
class Allocation:
    """The ``tag`` of an allocation's write: the step it allocates (no write follows it)."""

    step: ClaimStep


def allocation(step: ClaimStep, device: DeviceView, version: str, now: datetime) -> Write:
    """The write that allocates ``step``'s devices to the device's claim, on ``version``."""
    status = claims_api.hold_status(step.node, step.devices, device_name=device.name, device_uid=device.uid, now=now)
    return _status_write(device.namespace, device.name, status, version,
                         f"ResourceClaim {device.namespace}/{device.name} (allocated {len(step.devices)} device(s) "
                         f"on {step.node})", Allocation(step))


def allocations_after(written: Iterable[tuple[Write, Obj | None]], snapshot: Snapshot) -> list[Write]:
    """The allocation that follows each create or deallocation the server took, on the version it answered."""
    out: list[Write] = []
    for write, answer in written:
        step = write.tag
        if isinstance(step, ClaimStep) and answer is not None and step.device in snapshot.devices:
            out.append(allocation(step, snapshot.devices[step.device], meta.resource_version(answer), snapshot.now))
    return out

