"""A launcher pod's fields the pin reads: its ownerReferences and its VMI owner.

Its scheduling fields (tolerations, required node affinity) are
``cozygpu.api.scheduling``'s, read from ``meta.spec(pod)``; its containers
are never read. The owners are returned as sent, not walked, so a reader
compares their number with its bound before it looks for the VMI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from cozygpu.api.meta import metadata
from cozygpu.api.values import array, mapping, string

VMI_KIND: Final = "VirtualMachineInstance"
OWNERS_PATH: Final = "metadata.ownerReferences"


def owners(pod: Mapping[str, Any]) -> Sequence[Any]:
    """``metadata.ownerReferences`` as sent (empty when missing or not a list)."""
    return array(metadata(pod).get("ownerReferences"))


def vmi_owner(references: Sequence[Any]) -> tuple[str, str] | None:
    """(name, UID) of the first controller reference to a KubeVirt VMI among ``references``; None when none.

    Walks ``references``: the caller bounds their number first.
    """
    for entry in references:
        owner = mapping(entry)
        if (owner.get("controller") and owner.get("kind") == VMI_KIND
                and string(owner.get("apiVersion")).startswith("kubevirt.io/")):
            return string(owner.get("name")), string(owner.get("uid"))
    return None
