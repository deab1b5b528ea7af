"""The VMI webhook's decision before any write (R-ADM-2, R-ADM-3, R-ADM-5): pure, on one Snapshot.

Contract: :func:`plan_start` takes the VMI object, its parsed references and
the snapshot, and either raises :class:`Refused` (a ``Refusal`` of
``model/refusals.py``: the message names the object, the limit and the
numbers) or returns a :class:`StartPlan`: the set's
members (held devices and template devices, existing or to create), where
the dry check places the set, and whether an earlier invocation for the same
VMI already recorded a bind request this one takes as its own.

Checks, all before anything is written, in this order: the VMI has a name and
no VMI of that name exists; every referenced device exists, is not being
deleted and is not attached to another VMI that exists or may still appear
(within the attachment grace); a template device name is free or is this
VMI's own; with raw names forbidden the VMI carries no GPU entry of its own
(a ``gpus`` entry, a ``hostDevices`` entry or a resource of a name in the
effective set, R-MOD-9) beside the references; each template device passes
the GPUDevice webhook's check (``catalog.order_refusal``: it is an order, and
is created through that webhook); and ``place_set``, the model's dry check,
places the whole set (class, count, budgets counting the tenant's orders not
yet accepted, R-MOD-4, then one node with room).

Bounded (issue 22, ``bounds``): before anything is looked up, the VMI's name
and namespace lengths, its ``gpus``/``hostDevices``/resources lists and its
scheduling constraints (which the dry placement checks on every candidate
node) are compared with their limits; before any ``gpus`` entry is built, the
references' GPUs are added up and compared with ``MAX_VMI_GPUS`` (a template
over it is refused by the GPUDevice webhook's own check first, so the
message names the class's free units or maxCount). No work grows with a
count the tenant wrote. ``spec.resourceClaims`` is bounded like the device lists.

DRA (SPEC §1.5): a member whose class has ``source.dra`` is held by a
ResourceClaim in its namespace named after it (requests ``gpu-0`` …
``gpu-<count-1>`` of one device each, allocated by the binder on the
device's node). Its GPUs go to the VM as KubeVirt 1.9 takes DRA devices: one
``spec.resourceClaims`` entry naming the claim (:func:`claim_entries`) and
one ``gpus`` entry per GPU with ``claimName``/``requestName`` and no
``deviceName`` (KubeVirt's admitter refuses an entry with both). Its answer
is ready only once the claim shows that allocation (:func:`claim_unready`):
kube-scheduler allocates a claim that is not allocated yet itself, maybe on
another node, and the VM would then run on GPUs nobody holds for it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import attrs

from cozygpu.admission import bounds
from cozygpu.admission.refs import DeviceRef, Ref, TemplateRef
from cozygpu.api import claims, kubevirt, meta, scheduling
from cozygpu.model import refusals
from cozygpu.model.naming import template_device_name
from cozygpu.model.placement import order_check, place_set
from cozygpu.model.refusals import Refusal
from cozygpu.model.snapshot import DeviceView, Snapshot
from cozygpu.views.decode_dra import resource_claim_view
from cozygpu.views.decode_pods import vmi_view

#: Names of the ``gpus`` entries the webhook adds: ``cozygpu-gpu0``, ``cozygpu-gpu1``, ...
ENTRY_PREFIX: Final = "cozygpu-gpu"
#: Names of the ``spec.resourceClaims`` entries the webhook adds when a device's own name cannot be one
#: (taken by another entry, or not a DNS label, as a pod's claim entry must be): ``cozygpu-claim0``, ...
CLAIM_PREFIX: Final = "cozygpu-claim"
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

Obj = Mapping[str, Any]
#: An entry the webhook adds to a VMI list: a ``gpus`` entry or a ``spec.resourceClaims`` one.
_Entry = TypeVar("_Entry", kubevirt.GPU, kubevirt.ResourceClaim)


class Refused(Exception):
    """The start is refused; ``refusal`` says why, and ``str()`` is its message, the one a person reads."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@attrs.frozen(kw_only=True)
class Member:
    """One device of the VMI's set."""

    name: str
    class_name: str
    count: int
    #: The device as the cache holds it; None for a template device still to create.
    existing: DeviceView | None
    template: bool
    #: Its class sells DRA devices: its hold is the ResourceClaim named after it (SPEC §1.5).
    dra: bool = False


@attrs.frozen(kw_only=True)
class StartPlan:
    namespace: str
    vmi: str
    members: tuple[Member, ...]
    #: The node the dry check places the set on ("" when the start takes over an earlier request).
    node: str
    #: An earlier invocation's bind request for this VMI, taken as this one's (R-ADM-3); "" when none.
    adopted_request: str
    #: The ``gpus`` entries to add: one per GPU (a device-plugin GPU's ``deviceName``, a DRA GPU's
    #: ``claimName``/``requestName``).
    entries: tuple[kubevirt.GPU, ...]
    #: The ``spec.resourceClaims`` entries the DRA members' ``gpus`` entries name, one per DRA member (those
    #: the VMI has already are kept, not added again).
    claims: tuple[kubevirt.ResourceClaim, ...] = ()
    #: What the answer says besides: where stopped holds must move first to make room (R-BIND-11), or "".
    said: str = ""

    @property
    def to_create(self) -> tuple[Member, ...]:
        return tuple(m for m in self.members if m.existing is None)


def gpu_entries(snapshot: Snapshot, members: Sequence[Member],
                claim_names: Mapping[str, str] | None = None) -> tuple[kubevirt.GPU, ...]:
    """One ``gpus`` entry per GPU of the set, in reference order.

    A DRA member's (one named in ``claim_names``: member -> its ``resourceClaims`` entry) names that entry
    and request ``gpu-<i>`` of its claim instead of a device name: one device per entry, as KubeVirt takes it.
    """
    entries: list[kubevirt.GPU] = []
    for member in members:
        entry = (claim_names or {}).get(member.name)
        if entry is not None:
            entries.extend(kubevirt.GPU(f"{ENTRY_PREFIX}{len(entries)}", "", entry, claims.request_name(i))
                           for i in range(member.count))
            continue
        gpu_class = snapshot.classes.get(member.class_name)
        resource = gpu_class.resource_name if gpu_class is not None else ""
        entries.extend(kubevirt.GPU(f"{ENTRY_PREFIX}{len(entries)}", resource)
                       for _ in range(member.count))
    return tuple(entries)


def claim_entries(vmi: Obj, members: Sequence[Member]) -> tuple[kubevirt.ResourceClaim, ...]:
    """The ``spec.resourceClaims`` entry of each DRA member's claim, in member order.

    An entry the VMI has already for that claim is the one (a re-invocation, or the tenant's own): the
    patch then adds nothing and the ``gpus`` entries name it as before. Else the device's name, when it is
    a DNS label (a pod's claim entry must be) no other entry has; else ``cozygpu-claim<k>``, the first free.
    Reads the list ``check_sizes`` bounded.
    """
    dra = [member for member in members if member.dra]
    if not dra:
        return ()
    present = [kubevirt.resource_claim(entry) for entry in kubevirt.resource_claims(vmi) or ()]
    taken = {entry.name for entry in present}
    by_claim: dict[str, kubevirt.ResourceClaim] = {}
    for listed in present:
        if listed.name and listed.claim_name and not listed.template_name:
            by_claim.setdefault(listed.claim_name, listed)
    found: list[kubevirt.ResourceClaim] = []
    for member in dra:
        entry = by_claim.get(member.name)
        if entry is None:
            name = member.name
            if name in taken or not _DNS_LABEL.fullmatch(name):
                name = next(n for n in (f"{CLAIM_PREFIX}{k}" for k in range(len(taken) + 1)) if n not in taken)
            entry = by_claim[member.name] = kubevirt.ResourceClaim(name, member.name)
            taken.add(name)
        found.append(entry)
    return tuple(found)


def claim_unready(claim: Obj | None, *, device: str, node: str, count: int) -> str:
    """What keeps a DRA member's answer from being ready, in words ("" when it is ready).

    Ready: ``claim`` (the cache's ResourceClaim named after the GPUDevice ``device``) is owned by that
    device and its ``status.allocation`` selects ``node`` (the device's ``status.nodeName``) and holds
    ``count`` devices. A claim not allocated yet would be allocated by kube-scheduler itself when the
    launcher asks for it, maybe on another node, with devices no hold counts.
    """
    if claim is None:
        return "does not exist yet"
    view = resource_claim_view(claim)
    if not view.is_hold:
        return f"is not owned by GPUDevice {device}"
    if not view.allocated:
        return "is not allocated yet"
    if view.node != node:
        return f"is allocated on node {view.node}" if view.node else "is allocated on no single node"
    if len(view.allocated) != count:
        return f"holds {len(view.allocated)} device(s), not {count}"
    return ""


def _limited(refusal: Refusal | None) -> None:
    if refusal is not None:
        raise Refused(refusal)


def check_sizes(vmi: Obj, label: str) -> None:
    """Refuse a VMI whose lists or scheduling constraints are longer than admission reads (``bounds``)."""
    spec = meta.spec(vmi)
    domain = kubevirt.domain(vmi)
    terms = scheduling.required_terms(spec)
    for what, value, limit in (
            (kubevirt.GPUS_PATH, domain.gpus, bounds.MAX_LIST),
            (kubevirt.HOST_DEVICES_PATH, domain.host_devices, bounds.MAX_LIST),
            (kubevirt.REQUESTS_PATH, domain.requests, bounds.MAX_LIST),
            (kubevirt.LIMITS_PATH, domain.limits, bounds.MAX_LIST),
            (kubevirt.RESOURCE_CLAIMS_PATH, kubevirt.resource_claims(vmi) or (), bounds.MAX_LIST),
            ("spec.tolerations", scheduling.tolerations(spec), bounds.MAX_TOLERATIONS),
            ("spec.nodeSelector", scheduling.node_selector(spec), bounds.MAX_SELECTOR),
            (scheduling.TERMS_PATH, terms, bounds.MAX_TERMS)):
        _limited(bounds.over(label, what, value, limit))
    requirements = [r for term in terms for listed in (scheduling.match_expressions(term),
                                                       scheduling.match_fields(term))
                    for r in listed[:bounds.MAX_REQUIREMENTS + 1]]
    _limited(bounds.over(label, f"{scheduling.TERMS_PATH}: requirements", requirements, bounds.MAX_REQUIREMENTS))
    values = sum(min(len(scheduling.requirement_values(r)), bounds.MAX_VALUES + 1) for r in requirements)
    if values > bounds.MAX_VALUES:
        _limited(refusals.over_limit(label, f"{scheduling.TERMS_PATH}: requirements", limit=bounds.MAX_VALUES,
                                     found=values, unit="values or more"))


def own_gpu_entries(vmi: Obj, effective_names: frozenset[str], ours: Sequence[kubevirt.GPU]) -> list[str]:
    """The VMI's own GPU entries (R-ADM-5), leaving out the ``gpus`` entries this webhook added.

    Reads the lists ``check_sizes`` bounded.
    """
    domain = kubevirt.domain(vmi)
    added = set(ours)
    found: list[str] = []
    for entry in domain.gpus or ():
        gpu = kubevirt.gpu(entry)
        if gpu not in added:
            found.append(f"gpus entry {gpu.name!r} ({gpu.device_name or gpu.claim_name})")
    for entry in domain.host_devices:
        host = kubevirt.host_device(entry)
        if host.device_name in effective_names:
            found.append(f"hostDevices entry {host.name!r} ({host.device_name})")
    for section, names in (("requests", domain.requests), ("limits", domain.limits)):
        found.extend(f"resources.{section} {name}" for name in names if name in effective_names)
    return found


def _shown(items: Sequence[str], most: int = 5) -> list[str]:
    """The first ``most`` of ``items`` for a message, each cut short."""
    return [bounds.clip(item) for item in items[:most]]


def _attached_elsewhere(snapshot: Snapshot, device: DeviceView, vmi: str, *, now: datetime,
                        grace: timedelta) -> Refusal | None:
    """Why another VMI holds ``device`` (None when it is free, this VMI's, or its VMI is gone for good)."""
    attachment = device.attachment
    if attachment is None or attachment.vmi == vmi:
        return None
    other = snapshot.vmis.get((device.namespace, attachment.vmi))
    if other is not None and (not attachment.uid or not other.uid or other.uid == attachment.uid):
        return refusals.device_attached(device.namespace, device.name, vmi=attachment.vmi)
    if other is None and (attachment.attached_at is None or now - attachment.attached_at < grace):
        return refusals.device_attached_to_starting(device.namespace, device.name, vmi=attachment.vmi,
                                                    attached_at=attachment.attached_at)
    return None


def _adopted(members: Sequence[Member], vmi: str, *, now: datetime, recent: timedelta) -> str:
    """The request id of an earlier invocation for this VMI that every member carries, if recent."""
    ids = set()
    for member in members:
        device = member.existing
        if device is None or device.attachment is None or device.attachment.vmi != vmi:
            return ""
        request = device.bind_request
        if request is None or request.id != device.attachment.request_id or request.time is None:
            return ""
        if now - request.time > recent:
            return ""
        ids.add(request.id)
    return ids.pop() if len(ids) == 1 else ""


def plan_start(snapshot: Snapshot, vmi: Obj, refs: Sequence[Ref], *, namespace: str, raw_forbidden: bool,
               grace: timedelta, recent: timedelta) -> StartPlan:
    """Every refusal check of a VMI start, before any write (see the module contract)."""
    now = snapshot.now
    name = meta.name(vmi)
    if not name:
        raise Refused(refusals.vmi_unnamed())
    label = f"VMI {bounds.clip(namespace)}/{bounds.clip(name)}"
    _limited(bounds.name_problem(label, "metadata.name", name))
    _limited(bounds.name_problem(label, "namespace", namespace, bounds.MAX_NAMESPACE))
    check_sizes(vmi, label)
    if (namespace, name) in snapshot.vmis:
        raise Refused(refusals.vmi_exists(label))
    members: list[Member] = []
    for ref in refs:
        if isinstance(ref, DeviceRef):
            device = snapshot.devices.get((namespace, ref.device))
            if device is None:
                released = snapshot.released.get((namespace, ref.device))
                if released is not None:
                    raise Refused(refusals.hold_released(namespace, ref.device, released.class_name))
                raise Refused(refusals.unknown_device(namespace, ref.device))
            if device.deleting:
                raise Refused(refusals.device_deleting(namespace, ref.device))
            held = _attached_elsewhere(snapshot, device, name, now=now, grace=grace)
            if held is not None:
                raise Refused(held)
            members.append(Member(name=device.name, class_name=device.class_name, count=device.count,
                                  existing=device, template=device.template,
                                  dra=snapshot.sells_dra(device.class_name)))
            continue
        assert isinstance(ref, TemplateRef)
        device_name = template_device_name(name, ref.template)
        existing = snapshot.devices.get((namespace, device_name))
        if existing is not None:
            mine = existing.template and existing.attachment is not None and existing.attachment.vmi == name
            if not mine or existing.deleting:
                raise Refused(refusals.template_name_taken(namespace, device_name, template=ref.template,
                                                           vmi_subject=label, deleting=existing.deleting))
            if (existing.class_name, existing.count) != (ref.class_name, ref.count):
                raise Refused(refusals.template_differs(
                    namespace, device_name, template=ref.template, count=existing.count,
                    class_name=existing.class_name, wanted_count=ref.count, wanted_class=ref.class_name))
        members.append(Member(name=device_name, class_name=ref.class_name, count=ref.count, existing=existing,
                              template=True, dra=snapshot.sells_dra(ref.class_name)))
    total = sum(member.count for member in members)
    if total > bounds.MAX_VMI_GPUS:
        # Over what any VM takes: the order's own check first, for its numbers; then the cap. Nothing built yet.
        _template_orders(snapshot, namespace, label, members)
        _limited(refusals.over_limit(label, "its device references add up to", limit=bounds.MAX_VMI_GPUS,
                                     found=total, unit="GPUs"))
    claim_list = claim_entries(vmi, members)
    entries = gpu_entries(snapshot, members, {entry.claim_name: entry.name for entry in claim_list})
    if raw_forbidden:
        own = own_gpu_entries(vmi, snapshot.effective_names, entries)
        if own:
            raise Refused(refusals.raw_gpu_names(label, _shown(own), total=len(own)))
    adopted = _adopted(members, name, now=now, recent=recent)
    if adopted:
        return StartPlan(namespace=namespace, vmi=name, members=tuple(members), node="",
                         adopted_request=adopted, entries=entries, claims=claim_list)
    _template_orders(snapshot, namespace, label, members)
    views = [m.existing if m.existing is not None else
             DeviceView(namespace=namespace, name=m.name, class_name=m.class_name, count=m.count, template=True,
                        created=now) for m in members]
    # A VMI being created has no status (the API server drops it): only its name and spec are read.
    placement = place_set(snapshot, views, vmi=vmi_view({"metadata": {"namespace": namespace, "name": name},
                                                         "spec": meta.spec(vmi)}), label=label,
                          count_pending=True)
    if placement.refusal is not None:
        raise Refused(placement.refusal)
    said = f"{label}: {placement.compaction.said()}" if placement.compaction is not None else ""
    return StartPlan(namespace=namespace, vmi=name, members=tuple(members), node=placement.node or "",
                     adopted_request="", entries=entries, claims=claim_list, said=said)


def _template_orders(snapshot: Snapshot, namespace: str, label: str, members: Sequence[Member]) -> None:
    """Each template device still to create passes the GPUDevice webhook's check: it is an order."""
    for member in members:
        if member.existing is None:
            refusal = order_check(snapshot, namespace, member.class_name, member.count, label=member.name).refusal
            if refusal is not None:
                raise Refused(refusals.template_order_refused(label, member.name, refusal))


def gpus_patch(vmi: Obj, entries: Sequence[kubevirt.GPU],
               claim_list: Sequence[kubevirt.ResourceClaim] = ()) -> list[dict[str, Any]]:
    """The JSON patch adding ``entries`` to ``spec.domain.devices.gpus`` and ``claim_list`` to
    ``spec.resourceClaims`` (each only where not there already: a re-invocation adds nothing twice)."""
    domain = kubevirt.domain(vmi)
    if not domain.present:
        raise Refused(refusals.vmi_without_domain())
    patch = _added("/spec/resourceClaims", kubevirt.resource_claims(vmi), kubevirt.resource_claim, claim_list)
    if not domain.has_devices:
        return [*patch, {"op": "add", "path": "/spec/domain/devices",
                         "value": {"gpus": [e.as_json() for e in entries]}}]
    return [*patch, *_added("/spec/domain/devices/gpus", domain.gpus, kubevirt.gpu, entries)]


def _added(path: str, listed: Sequence[Any] | None, decode: Callable[[object], _Entry],
           wanted: Sequence[_Entry]) -> list[dict[str, Any]]:
    """The JSON patch adding to the list at ``path`` (``listed`` as sent; None when missing) the ``wanted``
    entries it does not hold (compared decoded): the whole list when there is none, else one append each."""
    present = set(map(decode, listed or ()))
    missing = [entry.as_json() for entry in wanted if entry not in present]
    if not missing:
        return []
    if listed is None:
        return [{"op": "add", "path": path, "value": missing}]
    return [{"op": "add", "path": f"{path}/-", "value": entry} for entry in missing]
