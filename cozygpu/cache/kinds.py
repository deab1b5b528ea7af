"""What to cache (``KindSpec``) and whether the API server serves it (discovery).

A ``KindSpec`` names one informer: a resource (group, version, plural), its
scope, and optionally a namespace and field/label selectors that restrict it
(the settings ConfigMap informer holds one object: namespace plus
``metadata.name=...``), a transform and named indexers. Its ``key`` names the
informer everywhere (``cache.store(key)``, metrics, event reasons).

Served kinds (R-RUN-3): a kind backed by a CRD (``needs_crd``) is served when a
CustomResourceDefinition ``<plural>.<group>`` is Established, has the expected
scope and serves ``version``; the cache learns it from its own CRD informer,
so a kind starts when its CRD appears and stops when it goes. A built-in kind
is checked once against API discovery (``/api/v1``, ``/apis/<group>/<version>``)
before its informer starts, and re-checked with backoff while absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

import attrs

from cozygpu.cache.decoders import PageDecoder
from cozygpu.cache.store import NAMESPACE, IndexFunc, index_namespace
from cozygpu.cache.transforms import Transform, slim_crd
from cozygpu.kube import errors, resource_path

#: API groups built into kube-apiserver (never CRDs): the core group and the ``*.k8s.io`` family.
_BUILT_IN_GROUPS: Final = frozenset({
    "", "apps", "batch", "autoscaling", "policy", "extensions",
})


def _is_built_in(group: str) -> bool:
    return group in _BUILT_IN_GROUPS or group.endswith(".k8s.io")


def _default_needs_crd(spec: KindSpec) -> bool:
    return not _is_built_in(spec.group)


@attrs.frozen
class KindSpec:
    """One informer: which objects to list and watch, and how to keep them."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    #: Restrict a namespaced kind to one namespace.
    namespace: str | None = attrs.field(default=None, kw_only=True)
    field_selector: str | None = attrs.field(default=None, kw_only=True)
    label_selector: str | None = attrs.field(default=None, kw_only=True)
    #: Runs on each decoded object before it is frozen (see ``transforms.py``).
    transform: Transform | None = attrs.field(default=None, kw_only=True, eq=False)
    #: Decodes a list page straight into transformed, frozen objects (``decoders.py``), in place of
    #: decoding it whole and running ``transform`` on each item; must agree with ``transform``.
    page_decoder: PageDecoder | None = attrs.field(default=None, kw_only=True, eq=False)
    indexers: Mapping[str, IndexFunc] = attrs.field(factory=dict, kw_only=True, eq=False)
    needs_crd: bool = attrs.field(
        default=attrs.Factory(_default_needs_crd, takes_self=True), kw_only=True
    )
    #: A short name for the informer (metrics, logs); defaults to the derived key.
    name: str | None = attrs.field(default=None, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if self.namespace is not None and not self.namespaced:
            raise ValueError(f"{self.resource}: a cluster-scoped kind cannot be restricted to a namespace")
        if self.needs_crd and _is_built_in(self.group):
            raise ValueError(f"{self.resource}: group {self.group!r} is built in, not served by a CRD")

    @property
    def resource(self) -> str:
        """``plural.version.group`` (``pods.v1`` for the core group)."""
        return f"{self.plural}.{self.version}" + (f".{self.group}" if self.group else "")

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """The informer's name: ``name`` if given, else the resource plus any restriction."""
        if self.name:
            return self.name
        parts = [self.resource]
        if self.namespace is not None:
            parts.append(f"namespace={self.namespace}")
        if self.field_selector:
            parts.append(f"fields={self.field_selector}")
        if self.label_selector:
            parts.append(f"labels={self.label_selector}")
        return " ".join(parts)

    @property
    def path(self) -> str:
        """The collection path to list and watch."""
        return resource_path(self.group, self.version, self.plural, namespace=self.namespace)

    def selector_params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        return params

    def all_indexers(self) -> dict[str, IndexFunc]:
        """The spec's indexers plus the built-in namespace index of namespaced kinds."""
        indexers: dict[str, IndexFunc] = {}
        if self.namespaced:
            indexers[NAMESPACE] = index_namespace
        indexers.update(self.indexers)
        return indexers


SpecOrKey = KindSpec | str

#: The cache's own informer of CRDs, the source of served-kind discovery.
CRDS: Final = KindSpec(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
    transform=slim_crd, name="customresourcedefinitions",
)


def crd_serves(crd: Mapping[str, Any] | None, spec: KindSpec) -> str | None:
    """None when ``crd`` serves ``spec``'s kind at its version, else why not."""
    if crd is None:
        return f"no CustomResourceDefinition {spec.crd_name}"
    body = crd.get("spec") or {}
    scope = "Namespaced" if spec.namespaced else "Cluster"
    if body.get("scope") not in (None, scope):
        return f"CustomResourceDefinition {spec.crd_name} has scope {body.get('scope')}, expected {scope}"
    versions = {v.get("name"): bool(v.get("served")) for v in body.get("versions") or ()}
    if not versions.get(spec.version):
        return f"CustomResourceDefinition {spec.crd_name} does not serve version {spec.version}"
    conditions = {c.get("type"): c.get("status") for c in (crd.get("status") or {}).get("conditions") or ()}
    if conditions.get("Established") != "True":
        return f"CustomResourceDefinition {spec.crd_name} is not established yet"
    if (crd.get("metadata") or {}).get("deletionTimestamp"):
        return f"CustomResourceDefinition {spec.crd_name} is being deleted"
    return None


class DiscoveryClient(Protocol):
    async def get(self, path: str, **kw: Any) -> dict[str, Any]: ...


async def discover(client: DiscoveryClient, spec: KindSpec, *, timeout: float) -> str | None:
    """None when API discovery lists ``spec``'s resource, else why not.

    Raises ``errors.KubeError`` when discovery itself cannot be read (the caller retries).
    """
    path = "/api/v1" if not spec.group else f"/apis/{spec.group}/{spec.version}"
    try:
        answer = await client.get(path, timeout=timeout)
    except errors.NotFound:
        return f"the API server does not serve {spec.api_version}"
    for resource in answer.get("resources") or ():
        if resource.get("name") == spec.plural:
            if bool(resource.get("namespaced")) != spec.namespaced:
                return f"{spec.resource} is {'namespaced' if resource.get('namespaced') else 'cluster-scoped'}"
            return None
    return f"{spec.api_version} has no resource {spec.plural}"
