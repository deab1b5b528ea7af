"""The ``metav1.Status`` the API server answers a refused request with: what its causes say."""

from __future__ import annotations

from cozygpu.api.meta import items, text


def cause_kinds(causes: object) -> frozenset[str]:
    """Each cause's ``type`` (its ``reason`` when it names no type) of a Status's ``details.causes``."""
    return frozenset(text(c, "type") or text(c, "reason") for c in items(causes))
