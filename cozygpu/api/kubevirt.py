"""A KubeVirt VMI's fields admission reads: its device references, its domain's GPU entries and resources.

The scheduling fields (tolerations, node selector, node affinity) are
``cozygpu.api.scheduling``'s, read from ``meta.spec(vmi)``. :func:`domain`
reads ``spec.domain`` once into a :class:`Domain` whose lists are the ones
sent, not walked (their length is free, and the webhook compares it with its
bound first); an entry is decoded when it is read (:func:`gpu`,
:func:`host_device`, :func:`resource_claim`). ``spec.resourceClaims`` (KubeVirt
1.9, VEP 10) is read the same way (:func:`resource_claims`): a GPU of a
DRA-sourced class reaches the VM as a ``gpus`` entry naming one of its
entries and a request of that claim, never a ``deviceName``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from cozygpu import keys
from cozygpu.api.meta import EMPTY, metadata, spec
from cozygpu.api.values import array, array_or_none, mapping, mapping_or_none, string

GPUS_PATH: Final = "spec.domain.devices.gpus"
HOST_DEVICES_PATH: Final = "spec.domain.devices.hostDevices"
REQUESTS_PATH: Final = "spec.domain.resources.requests"
LIMITS_PATH: Final = "spec.domain.resources.limits"
RESOURCE_CLAIMS_PATH: Final = "spec.resourceClaims"


@attrs.frozen
class GPU:
    """A ``spec.domain.devices.gpus`` entry ("" for a missing or mistyped field).

    A device-plugin GPU names its resource (``deviceName``); a DRA GPU names a
    ``spec.resourceClaims`` entry (``claimName``) and a request of that claim
    (``requestName``). KubeVirt's admitter refuses an entry with both.
    """

    name: str
    device_name: str
    claim_name: str = ""
    request_name: str = ""

    def as_json(self) -> dict[str, str]:
        """The entry the webhook writes: ``name`` and ``deviceName``, or, with no device name, ``name``,
        ``claimName`` and ``requestName`` (never both kinds: KubeVirt would refuse it)."""
        if self.device_name:
            return {"name": self.name, "deviceName": self.device_name}
        return {"name": self.name, "claimName": self.claim_name, "requestName": self.request_name}


@attrs.frozen
class ResourceClaim:
    """A ``spec.resourceClaims`` entry ("" for a missing or mistyped field): a list-map keyed by ``name``,
    naming a ResourceClaim (``resourceClaimName``) or a template (``resourceClaimTemplateName``)."""

    name: str
    claim_name: str = ""
    template_name: str = ""

    def as_json(self) -> dict[str, str]:
        """The entry the webhook writes: ``name`` and ``resourceClaimName`` (it names held claims only)."""
        return {"name": self.name, "resourceClaimName": self.claim_name}


@attrs.frozen
class HostDevice:
    """A ``spec.domain.devices.hostDevices`` entry ("" for a missing or mistyped field)."""

    name: str
    device_name: str


@attrs.frozen(kw_only=True)
class Domain:
    """``spec.domain`` as admission reads it: present or not, and its device lists and resources as sent."""

    #: ``spec.domain`` is an object (a VMI without one is not a VMI KubeVirt runs).
    present: bool
    #: ``devices`` is an object (a patch adding ``gpus`` creates it otherwise).
    has_devices: bool
    #: ``devices.gpus`` as sent; None when missing or not a list (a patch creates it).
    gpus: Sequence[Any] | None
    #: ``devices.hostDevices`` as sent (empty when missing or not a list).
    host_devices: Sequence[Any]
    #: ``resources.requests`` and ``resources.limits`` (empty when missing or not an object).
    requests: Mapping[str, Any]
    limits: Mapping[str, Any]


def device_refs(vmi: Mapping[str, Any]) -> str | None:
    """The ``device-refs`` annotation's text; None when missing or not a string (one lookup, nothing walked)."""
    value = mapping(metadata(vmi).get("annotations")).get(keys.DEVICE_REFS_ANNOTATION)
    return value if isinstance(value, str) else None


def domain(vmi: Mapping[str, Any]) -> Domain:
    """The VMI's ``spec.domain``, read once (a few lookups whatever it holds)."""
    found = mapping_or_none(spec(vmi).get("domain"))
    devices = mapping_or_none((found or EMPTY).get("devices"))
    listed = devices or EMPTY
    resources = mapping((found or EMPTY).get("resources"))
    return Domain(present=found is not None, has_devices=devices is not None,
                  gpus=array_or_none(listed.get("gpus")), host_devices=array(listed.get("hostDevices")),
                  requests=mapping(resources.get("requests")), limits=mapping(resources.get("limits")))


def gpu(entry: object) -> GPU:
    """One ``gpus`` entry."""
    item = mapping(entry)
    return GPU(name=string(item.get("name")), device_name=string(item.get("deviceName")),
               claim_name=string(item.get("claimName")), request_name=string(item.get("requestName")))


def host_device(entry: object) -> HostDevice:
    """One ``hostDevices`` entry."""
    item = mapping(entry)
    return HostDevice(name=string(item.get("name")), device_name=string(item.get("deviceName")))


def resource_claims(vmi: Mapping[str, Any]) -> Sequence[Any] | None:
    """``spec.resourceClaims`` as sent (not walked); None when missing or not a list (a patch creates it)."""
    return array_or_none(spec(vmi).get("resourceClaims"))


def resource_claim(entry: object) -> ResourceClaim:
    """One ``spec.resourceClaims`` entry."""
    item = mapping(entry)
    return ResourceClaim(name=string(item.get("name")), claim_name=string(item.get("resourceClaimName")),
                         template_name=string(item.get("resourceClaimTemplateName")))
