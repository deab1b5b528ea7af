"""A small Cozystack tenant tree for the tests that race orders against budgets: a parent, two children, another."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from cozygpu.kube import Client, resource_path

NAMESPACES = resource_path("", "v1", "namespaces")


@attrs.define
class Tenants:
    parent: str
    children: list[str]
    other: str

    @property
    def all(self) -> list[str]:
        return [self.parent, *self.children, self.other]


async def make_tenants(admin: Client, parent: str, other: str, *,
                       labels: Mapping[str, str] | None = None) -> Tenants:
    """``parent`` with children ``-ml`` and ``-web``, and ``other`` beside them, created as namespaces."""
    tenants = Tenants(parent=parent, children=[f"{parent}-ml", f"{parent}-web"], other=other)
    for name in tenants.all:
        await admin.create(NAMESPACES, {"metadata": {"name": name, "labels": dict(labels or {})}})
    return tenants
