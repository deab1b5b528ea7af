"""The tenant walk and the tenant release-name mapping (R-MOD-1).

Why: budgets cap a tenant's whole subtree, entitlement is inherited down the
tree, and the tenant's HelmRelease is where its ``resourceQuotas`` live. The
binder, the webhooks, the catalog and cozystack-api's gate must agree on what
a tenant namespace is and who its parent is, so the walk exists once.

Contract (Cozystack naming, tenant names have no dashes):
``tenant-root`` has no parent; ``tenant-a`` has parent ``tenant-root``;
``tenant-a-b`` has parent ``tenant-a``; a namespace without the ``tenant-``
prefix, or with an empty segment (``tenant-``, ``tenant-a--b``), belongs to
no tenant. The walk is by name only: labels and owner references can be
written by others and are not read.
"""

from __future__ import annotations

import attrs

TENANT_ROOT = "tenant-root"
TENANT_PREFIX = "tenant-"


def is_tenant_namespace(namespace: str) -> bool:
    """True for ``tenant-root`` and every ``tenant-<a>[-<b>...]`` with non-empty segments."""
    if namespace == TENANT_ROOT:
        return True
    if not namespace.startswith(TENANT_PREFIX):
        return False
    return all(namespace[len(TENANT_PREFIX) :].split("-"))


def parent_namespace(namespace: str) -> str | None:
    """The parent tenant namespace, or None for ``tenant-root`` and non-tenant namespaces."""
    if namespace == TENANT_ROOT or not is_tenant_namespace(namespace):
        return None
    head, _, _ = namespace.rpartition("-")
    return TENANT_ROOT if head == "tenant" else head


def ancestry(namespace: str) -> tuple[str, ...]:
    """The namespace itself, then each ancestor up to ``tenant-root``; empty for a non-tenant namespace."""
    if not is_tenant_namespace(namespace):
        return ()
    chain = [namespace]
    parent = parent_namespace(namespace)
    while parent is not None:
        chain.append(parent)
        parent = parent_namespace(parent)
    return tuple(chain)


@attrs.frozen(kw_only=True)
class ReleaseRef:
    """Where a tenant's HelmRelease lives: its name and the namespace it is stored in."""

    name: str
    namespace: str


def tenant_release(namespace: str) -> ReleaseRef | None:
    """The HelmRelease that owns a tenant namespace.

    ``tenant-root`` is its own release in itself; ``tenant-a`` is release
    ``tenant-a`` in ``tenant-root``; ``tenant-a-b`` is release ``tenant-b`` in
    ``tenant-a`` (the release is named after the last segment, stored in the
    parent). None for a namespace that belongs to no tenant.
    """
    if namespace == TENANT_ROOT:
        return ReleaseRef(name=TENANT_ROOT, namespace=TENANT_ROOT)
    parent = parent_namespace(namespace)
    if parent is None:
        return None
    last = namespace.rpartition("-")[2]
    return ReleaseRef(name=f"{TENANT_PREFIX}{last}", namespace=parent)
