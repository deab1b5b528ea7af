"""A pod's effective requests, with the scheduler's arithmetic (R-MOD-4).

Why: raw-name pods count under raw keys and against node capacity. If we
summed only app containers (as older Cozystack code did) the binder could
book a unit that a sidecar or an init container of a raw-name pod holds.

Contract, per resource (Kubernetes ``PodRequests``):

    max(sum(app containers) + sum(sidecars),
        max over regular init containers i of (init_i + sum(sidecars declared before i)))
    + overhead

A sidecar is an init container with ``restartPolicy: Always``. A container
that sets only a limit is requested at its limit (API defaulting). Pod-level
requests replace cpu, memory and hugepages only; extended resources are
never pod-level. Pods in a final phase count nowhere; that filter is the
caller's (``PodView.final``), this module does arithmetic only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

import attrs

from cozygpu.model.quantities import QuantityError, parse_quantity

ResourceList = Mapping[str, Fraction]

_POD_LEVEL = ("cpu", "memory")
_HUGEPAGES = "hugepages-"


@attrs.frozen(kw_only=True)
class InitContainer:
    requests: ResourceList
    #: ``restartPolicy: Always``: a sidecar that runs alongside the app containers.
    sidecar: bool = False


@attrs.frozen(kw_only=True)
class PodResources:
    containers: tuple[ResourceList, ...] = ()
    init_containers: tuple[InitContainer, ...] = ()
    overhead: ResourceList = attrs.field(factory=dict)
    #: ``spec.resources.requests`` (pod-level resources): only cpu, memory and hugepages apply.
    pod_level: ResourceList = attrs.field(factory=dict)


def container_requests(requests: Mapping[str, object], limits: Mapping[str, object]) -> dict[str, Fraction]:
    """A container's requests as the API server stores them: a limit without a request requests the limit.

    Raises QuantityError for a value that is not a quantity.
    """
    merged: dict[str, Fraction] = {}
    for name, value in limits.items():
        merged[name] = parse_quantity(value)
    for name, value in requests.items():
        merged[name] = parse_quantity(value)
    return merged


def _add(into: dict[str, Fraction], more: ResourceList) -> None:
    for name, amount in more.items():
        into[name] = into.get(name, Fraction(0)) + amount


def _max(into: dict[str, Fraction], other: ResourceList) -> None:
    for name, amount in other.items():
        if amount > into.get(name, Fraction(0)):
            into[name] = amount


def pod_requests(resources: PodResources) -> dict[str, Fraction]:
    """The pod's effective requests per resource, overhead included."""
    running: dict[str, Fraction] = {}
    for container in resources.containers:
        _add(running, container)
    sidecars_so_far: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for init in resources.init_containers:
        if init.sidecar:
            _add(running, init.requests)
            _add(sidecars_so_far, init.requests)
        else:
            use = dict(init.requests)
            _add(use, sidecars_so_far)
            _max(init_peak, use)
    _max(running, init_peak)
    for name, amount in resources.pod_level.items():
        if name in _POD_LEVEL or name.startswith(_HUGEPAGES):
            running[name] = amount
    _add(running, resources.overhead)
    return running


def whole_requests(requests: Mapping[str, Fraction], names: Iterable[str] | None = None) -> dict[str, int]:
    """Requests of extended resources as whole units (the API refuses fractions of them).

    With ``names`` only those resources are kept; otherwise every extended
    resource (a name with a domain, like ``nvidia.com/X``). A fraction rounds
    up: a pod asking for part of a device holds the device.
    """
    wanted = None if names is None else set(names)
    result: dict[str, int] = {}
    for name, amount in requests.items():
        if wanted is not None and name not in wanted:
            continue
        if wanted is None and "/" not in name:
            continue
        if amount > 0:
            result[name] = -((-amount.numerator) // amount.denominator)
    return result


__all__ = [
    "InitContainer",
    "PodResources",
    "QuantityError",
    "ResourceList",
    "container_requests",
    "pod_requests",
    "whole_requests",
]
