"""A ``coordination.k8s.io/v1`` Lease's holder, as a refusal reports the leader's state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from cozygpu.api.meta import spec
from cozygpu.api.values import string


@attrs.frozen
class Holder:
    """Who holds the Lease and when they last renewed it, as written ("" when not set)."""

    identity: str
    renewed: str


def holder(lease: Mapping[str, Any] | None) -> Holder:
    """``spec.holderIdentity`` and ``spec.renewTime`` of ``lease`` ("" for a missing Lease or field)."""
    fields = spec(lease)
    return Holder(identity=string(fields.get("holderIdentity")), renewed=string(fields.get("renewTime")))
