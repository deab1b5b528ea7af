"""Hold claims (SPEC §1.5): each Bound device of a DRA-sourced class holds its devices as a ResourceClaim.

Why: kube-scheduler counts a device as taken for every other pod only while
some claim's allocation names it. A launcher's own claim is released when the
pod goes; the hold claim is allocated by the binder itself and reserved for
the GPUDevice, so the resourceclaim controller leaves it alone while the VM
is off (verified with the real components, ``tests/devcluster/test_dra_plane.py``).

Contract:
- ``claims_plan`` is pure: from the snapshot and the DRA tracker of the same
  instant (``LiveSnapshot.dra``) it returns ``model.dra.claim_plan``'s steps
  (a claim under a VM, ``in_use``, is never moved) and the hold claims whose
  device no longer holds (deleted, unless a VMI it is attached to still
  exists: R-BIND-7).
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

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Final

import attrs

from cozygpu.api import claims as claims_api
from cozygpu.api import meta
from cozygpu.binder.patcher import Verb, Write
from cozygpu.kube import resource_path
from cozygpu.model.dra import ClaimAction, ClaimStep, DraTracker, claim_plan
from cozygpu.model.snapshot import DeviceKey, DeviceView, Snapshot
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


def in_use(snapshot: Snapshot) -> frozenset[DeviceKey]:
    """Devices attached to a VMI that exists: their claim is what its launcher runs on (R-BIND-7)."""
    return frozenset(device.key for device in snapshot.devices.values()
                     if (vmi := device.vmi_key) is not None and vmi in snapshot.vmis)


def claims_plan(snapshot: Snapshot, dra: DraTracker) -> ClaimsPlan:
    """What the hold claims need (see the module docstring)."""
    own = {key: claim for key, claim in dra.claims.items() if claim.is_hold}
    used = in_use(snapshot)
    holds = [device for device in snapshot.devices.values() if snapshot.sells_dra(device.class_name)]
    # Devices someone else's claim holds are no one's to choose: the offers' units without them, on the nodes
    # holds are on (a pass costs the holds, not the fleet's slices).
    nodes = {device.node_name for device in holds if device.node_name is not None}
    units = {name: attrs.evolve(offer, by_node={node: tuple(ref for ref in offer.by_node.get(node, ())
                                                            if not dra.foreign(ref)) for node in nodes})
             for name, offer in dra.units.items()}
    steps = claim_plan(holds, snapshot.classes, own, units, dra.attrs_of, in_use=used)
    release = tuple(sorted(key for key in own if key not in used and not _holds(snapshot, key)))
    return ClaimsPlan(steps=tuple(steps), release=release)


def _holds(snapshot: Snapshot, key: DeviceKey) -> bool:
    device = snapshot.devices.get(key)
    return device is not None and device.holds_units and snapshot.sells_dra(device.class_name)


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


def allocation(step: ClaimStep, device: DeviceView, version: str, now: datetime) -> Write:
    """The write that allocates ``step``'s devices to the device's claim, on ``version``."""
    status = claims_api.hold_status(step.node, step.devices, device_name=device.name, device_uid=device.uid, now=now)
    return _status_write(device.namespace, device.name, status, version,
                         f"ResourceClaim {device.namespace}/{device.name} (allocated {len(step.devices)} device(s) "
                         f"on {step.node})", None)


def allocations_after(written: Iterable[tuple[Write, Obj | None]], snapshot: Snapshot) -> list[Write]:
    """The allocation that follows each create or deallocation the server took, on the version it answered."""
    out: list[Write] = []
    for write, answer in written:
        step = write.tag
        if isinstance(step, ClaimStep) and answer is not None and step.device in snapshot.devices:
            out.append(allocation(step, snapshot.devices[step.device], meta.resource_version(answer), snapshot.now))
    return out

