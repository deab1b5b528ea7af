"""Decode pods and VMIs into the model's views: what a pod asks for (R-MOD-6), which VMI it claims to launch,
and what a VMI lists as its launchers (R-MOD-5).

Contract: as ``cozygpu.views.decode``'s: pure functions of JSON mappings, never mutated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cozygpu.api.times import parse_time
from cozygpu.model.pods import InitContainer, PodResources, container_requests, pod_requests, whole_requests
from cozygpu.model.snapshot import NodeSelectorTerm, PodPhase, PodView, VMIView
from cozygpu.views.decode import EMPTY_OBJECT, Obj, as_list, as_map, as_str, is_map, requirements, tolerations

_POD_PHASES = {p.value: p for p in PodPhase}


def _extended(section: Mapping[str, Any]) -> Mapping[str, Any]:
    return {k: v for k, v in section.items() if "/" in k}


def _requests(container: Mapping[str, Any], *, extended_only: bool) -> dict[str, Any]:
    resources = as_map(container.get("resources"))
    requests, limits = as_map(resources.get("requests")), as_map(resources.get("limits"))
    if extended_only:
        requests, limits = _extended(requests), _extended(limits)
    return container_requests(requests, limits)


def pod_resources(spec: Mapping[str, Any], *, extended_only: bool = False) -> PodResources:
    """The parts of a pod spec the scheduler's arithmetic reads. Raises QuantityError on a bad quantity.

    With ``extended_only`` only extended resources (``domain/name``) are
    read: all a snapshot needs, and far fewer quantities to parse.
    """
    containers = tuple(_requests(c, extended_only=extended_only) for c in as_list(spec.get("containers")) if is_map(c))
    inits = tuple(
        InitContainer(requests=_requests(c, extended_only=extended_only), sidecar=c.get("restartPolicy") == "Always")
        for c in as_list(spec.get("initContainers"))
        if is_map(c)
    )
    overhead, pod_level = as_map(spec.get("overhead")), as_map(as_map(spec.get("resources")).get("requests"))
    if extended_only:
        overhead, pod_level = _extended(overhead), EMPTY_OBJECT
    return PodResources(
        containers=containers,
        init_containers=inits,
        overhead=container_requests(overhead, EMPTY_OBJECT),
        pod_level=container_requests(pod_level, EMPTY_OBJECT),
    )


def asks_extended(spec: Mapping[str, Any]) -> bool:
    """Whether a pod spec requests or limits an extended resource (``domain/name``) in any container."""
    for field in ("containers", "initContainers"):
        for container in as_list(spec.get(field)):
            if not is_map(container):
                continue
            resources = as_map(container.get("resources"))
            for section in ("requests", "limits"):
                if any("/" in name for name in as_map(resources.get(section))):
                    return True
    return False


def _whole(value: object) -> int | None:
    """A quantity that is a plain whole number (``2``, ``"2"``), else None (left to ``parse_quantity``)."""
    if type(value) is int:
        return value
    if type(value) is str and value.isdigit() and value.isascii():
        return int(value)
    return None


def _plain_requests(spec: Mapping[str, Any]) -> dict[str, int] | None:
    """The extended requests of a plain pod without Fractions, or None when it is not plain.

    Plain: no init containers, no overhead, and every extended quantity a
    whole number. Most GPU pods are (a launcher is one container with
    ``limits: {nvidia.com/X: "1"}``), and for them the scheduler's arithmetic
    is just the sum over containers of each one's request, or its limit when
    it sets no request. Anything else returns None and takes the general path
    (``pod_resources`` -> ``pod_requests`` -> ``whole_requests``), which gives
    the same answer on plain pods and reports bad quantities.
    """
    if spec.get("initContainers") or spec.get("overhead"):
        return None
    total: dict[str, int] = {}
    for container in as_list(spec.get("containers")):
        if not is_map(container):
            continue
        resources = as_map(container.get("resources"))
        merged: dict[str, int] = {}
        for section in (as_map(resources.get("limits")), as_map(resources.get("requests"))):  # a request wins
            for name, value in section.items():
                if "/" in name:
                    amount = _whole(value)
                    if amount is None:
                        return None
                    merged[name] = amount
        for name, amount in merged.items():
            total[name] = total.get(name, 0) + amount
    return {name: amount for name, amount in total.items() if amount > 0}


def pod_view(obj: Obj) -> PodView:
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    status = as_map(obj.get("status"))
    requests = _plain_requests(spec)
    if requests is None:
        requests = whole_requests(pod_requests(pod_resources(spec, extended_only=True))) if asks_extended(spec) else {}
    return PodView(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        uid=as_str(meta.get("uid")),
        node_name=as_str(spec.get("nodeName")) or None,
        phase=_POD_PHASES.get(as_str(status.get("phase")), PodPhase.PENDING),
        requests=requests,
        claims_vmi=_claimed_vmi(meta.get("ownerReferences")),
        created=parse_time(meta.get("creationTimestamp")),
    )


def _claimed_vmi(owners: object) -> tuple[str, str] | None:
    """The (name, UID) of a controller ownerReference to a KubeVirt VMI: what the pod claims to launch."""
    for owner in as_list(owners):
        if (isinstance(owner, Mapping) and owner.get("controller") is True
                and owner.get("kind") == "VirtualMachineInstance"
                and as_str(owner.get("apiVersion")).startswith("kubevirt.io/")):
            return as_str(owner.get("name")), as_str(owner.get("uid"))
    return None


def vmi_view(obj: Obj) -> VMIView:
    meta = as_map(obj.get("metadata"))
    spec = as_map(obj.get("spec"))
    status = as_map(obj.get("status"))
    return VMIView(
        namespace=as_str(meta.get("namespace")),
        name=as_str(meta.get("name")),
        uid=as_str(meta.get("uid")),
        phase=as_str(status.get("phase")),
        node_name=as_str(status.get("nodeName")) or None,
        active_pods=frozenset(map(str, as_map(status.get("activePods")))),
        tolerations=tolerations(spec.get("tolerations")),
        node_selector={str(k): str(v) for k, v in as_map(spec.get("nodeSelector")).items()},
        node_affinity=_required_node_affinity(spec.get("affinity")),
    )


def _required_node_affinity(affinity: object) -> tuple[NodeSelectorTerm, ...] | None:
    """``nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``; None when not set."""
    node_affinity = as_map(as_map(affinity).get("nodeAffinity"))
    required = as_map(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return None
    return tuple(
        NodeSelectorTerm(
            match_expressions=requirements(term.get("matchExpressions")),
            match_fields=requirements(term.get("matchFields")),
        )
        for term in as_list(required.get("nodeSelectorTerms"))
        if is_map(term)
    )
