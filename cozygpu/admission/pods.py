"""The launcher pod webhook (mutating, CREATE, device-refs and ``kubevirt.io=virt-launcher``): pin it (R-ADM-4).

The pod's VMI is its controller ownerReference (KubeVirt writes it; the pod
has no UID of its own yet, so ``status.activePods`` cannot name it). The
VMI's devices are those attached to the VMI's name in this replica's cache
(and, when the attachment knows the VMI's UID, to that UID). They must all be
Bound on one node; then the pod gets a required node affinity to that node
(``matchFields metadata.name``, ANDed into every term it already has, since
terms are ORed) and the tolerations of the devices' classes it lacks. The
pin goes on the pod, not the VMI: LiveUpdate rewrites the VMI's affinity
from the VM template.

DRA (SPEC §1.5): when every device is of a DRA-sourced class, the pod gets
no node affinity, only the tolerations: its ``resourceClaims`` are the held
claims, and kube-scheduler places it by their allocation's node selector
(the node the binder allocated them on). A set mixing both kinds is pinned
as before; its devices share one node all the same.

Bounded (issue 22, ``bounds``): the ownerReferences, the owner's name, the
required node-affinity terms (the pin copies each) and the tolerations (each
class toleration is looked up among them) are compared with their limits
before they are read; the containers are never read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cozygpu.admission import bounds
from cozygpu.admission.envelope import Request, Verdict
from cozygpu.admission.view import NotReady, SnapshotSource
from cozygpu.api import meta, pods, scheduling
from cozygpu.model import refusals
from cozygpu.model.refusals import Refusal
from cozygpu.model.snapshot import Toleration


def _size_problem(pod: Mapping[str, Any], label: str) -> Refusal | None:
    """The first list of ``pod`` the webhook reads that is longer than ``bounds`` allows."""
    spec = meta.spec(pod)
    terms = scheduling.required_terms(spec)
    for what, value, limit in (
            (pods.OWNERS_PATH, pods.owners(pod), bounds.MAX_OWNERS),
            ("spec.tolerations", scheduling.tolerations(spec), bounds.MAX_LIST),
            (scheduling.TERMS_PATH, terms, bounds.MAX_TERMS)):
        refusal = bounds.over(label, what, value, limit)
        if refusal is not None:
            return refusal
    for index, term in enumerate(terms):
        refusal = bounds.over(label, f"nodeSelectorTerms[{index}].matchFields", scheduling.match_fields(term),
                              bounds.MAX_REQUIREMENTS)
        if refusal is not None:
            return refusal
    return None


def _toleration(t: Toleration) -> dict[str, Any]:
    out: dict[str, Any] = {"operator": t.operator}
    for field, value in (("key", t.key), ("value", t.value), ("effect", t.effect)):
        if value:
            out[field] = value
    return out


def pin_patch(pod: Mapping[str, Any], node: str, tolerations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The JSON patch: a required node affinity to ``node`` and the missing ``tolerations``."""
    return [*_affinity_patch(pod, node), *tolerations_patch(pod, tolerations)]


def _affinity_patch(pod: Mapping[str, Any], node: str) -> list[dict[str, Any]]:
    spec = meta.spec(pod)
    requirement = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = scheduling.required_terms(spec)
    if terms:
        path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
        return [{"op": "replace", "path": path,
                 "value": [scheduling.with_match_field(term, requirement) for term in terms]}]
    value = {"nodeSelectorTerms": [{"matchFields": [requirement]}]}
    if scheduling.affinity(spec) is None:
        return [{"op": "add", "path": "/spec/affinity",
                 "value": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": value}}}]
    if scheduling.node_affinity(spec) is None:
        return [{"op": "add", "path": "/spec/affinity/nodeAffinity",
                 "value": {"requiredDuringSchedulingIgnoredDuringExecution": value}}]
    return [{"op": "add", "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuring"
             "Execution", "value": value}]


def tolerations_patch(pod: Mapping[str, Any], tolerations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The JSON patch adding the ``tolerations`` the pod lacks: all that the launcher of DRA devices only
    gets (kube-scheduler places it by its claims, and the tolerations let it onto their node)."""
    present = scheduling.tolerations_or_none(meta.spec(pod))
    missing = [t for t in tolerations if present is None or t not in present]
    if not missing:
        return []
    if present is not None:
        return [{"op": "add", "path": "/spec/tolerations/-", "value": t} for t in missing]
    return [{"op": "add", "path": "/spec/tolerations", "value": missing}]


class LauncherPodWebhook:
    def __init__(self, source: SnapshotSource) -> None:
        self._source = source

    async def __call__(self, request: Request) -> Verdict:
        if request.operation != "CREATE":
            return Verdict.allow()
        pod = request.object
        namespace = request.namespace or meta.namespace(pod)
        problem = (bounds.name_problem(f"launcher pod in {bounds.clip(namespace)}", "namespace", namespace,
                                       bounds.MAX_NAMESPACE)
                   or _size_problem(pod, f"launcher pod in {namespace}"))
        if problem is not None:
            return Verdict.refuse(problem)
        owner = pods.vmi_owner(pods.owners(pod))
        if owner is None or not owner[0]:
            return Verdict.refuse(refusals.no_vmi_owner(f"launcher pod in {namespace}"))
        vmi, uid = owner
        label = f"launcher pod of VMI {namespace}/{bounds.clip(vmi)}"
        problem = bounds.name_problem(label, "the owner's name", vmi) or bounds.name_problem(
            label, "the owner's uid", uid, bounds.MAX_UID)
        if problem is not None:
            return Verdict.refuse(problem)
        try:
            snapshot = await self._source.snapshot()
        except NotReady as error:
            return Verdict.not_ready(str(error))
        devices = [snapshot.devices[k] for k in snapshot.devices_by_vmi.get((namespace, vmi), ())]
        devices = [d for d in devices if d.attachment is not None and (not d.attachment.uid or not uid
                                                                         or d.attachment.uid == uid)]
        if not devices:
            return Verdict.refuse(refusals.not_attached(label))
        unbound = [d for d in devices if not d.holds_units]
        if unbound:
            return Verdict.refuse(refusals.not_bound(label, [(d.name, str(d.phase)) for d in unbound]))
        nodes = sorted({d.node_name or "" for d in devices})
        if len(nodes) != 1:
            return Verdict.refuse(refusals.split_set(label, nodes))
        tolerations: list[dict[str, Any]] = []
        for class_name in sorted({d.class_name for d in devices}):
            gpu_class = snapshot.classes.get(class_name)
            for toleration in gpu_class.tolerations if gpu_class is not None else ():
                entry = _toleration(toleration)
                if entry not in tolerations:
                    tolerations.append(entry)
        if all(snapshot.sells_dra(d.class_name) for d in devices):
            return Verdict.allow(tolerations_patch(pod, tolerations))
        return Verdict.allow(pin_patch(pod, nodes[0], tolerations))

