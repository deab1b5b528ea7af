"""Apply manifests to a cluster: server-side apply through API discovery.

Used by the local control plane (install the chart's CRDs, the demo) and by
the tests (fixture CRDs, rendered chart output). Development tooling, not the
controller: the controller never applies manifests.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from cozygpu.kube import Client, errors

FIELD_MANAGER = "cozygpu-dev"

#: Minimal CRDs of the kinds cozygpu reads but does not own (KubeVirt, Cozystack): the demo installs the
#: KubeVirt ones for the stand-in, the tests install any of them at any moment (``crds/README.md``).
STANDIN_CRDS = Path(__file__).resolve().parent / "crds"
KUBEVIRT_CRDS = ("kubevirt.io_virtualmachineinstances.yaml", "kubevirt.io_virtualmachines.yaml")


def chart_dir() -> Path:
    """The Helm chart (``manifests/``) of this checkout, or ``$COZYGPU_CHART``."""
    override = os.environ.get("COZYGPU_CHART")
    return Path(override) if override else Path(__file__).resolve().parents[2] / "manifests"


def crd_files() -> list[Path]:
    return sorted((chart_dir() / "templates" / "crds").glob("*.yaml"))


def load_yaml_documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict) and doc]


def load_files(paths: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        docs += load_yaml_documents(path.read_text())
    return docs


class RestMapper:
    """apiVersion + kind → (plural, namespaced), from discovery, refreshed on a miss."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._known: dict[tuple[str, str], tuple[str, bool]] = {}

    async def resolve(self, api_version: str, kind: str) -> tuple[str, bool]:
        key = (api_version, kind)
        if key not in self._known:
            path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
            try:
                listing = await self._client.get(path)
            except errors.NotFound:
                raise LookupError(f"{api_version} is not served") from None
            for res in listing.get("resources", []):
                if "/" not in res["name"]:
                    self._known[(api_version, res["kind"])] = (res["name"], bool(res["namespaced"]))
        if key not in self._known:
            raise LookupError(f"kind {kind} is not served in {api_version}")
        return self._known[key]

    async def path(self, obj: dict[str, Any], *, namespace: str | None = None, named: bool = True) -> str:
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural, namespaced = await self.resolve(api_version, kind)
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        ns = obj.get("metadata", {}).get("namespace") or namespace
        parts = [prefix]
        if namespaced:
            if not ns:
                raise ValueError(f"{kind} {obj['metadata'].get('name')} needs a namespace")
            parts.append(f"namespaces/{ns}")
        parts.append(plural)
        if named:
            parts.append(obj["metadata"]["name"])
        return "/".join(parts)


async def apply_objects(
    client: Client, objects: Iterable[dict[str, Any]], *, namespace: str | None = None,
    field_manager: str = FIELD_MANAGER,
) -> list[dict[str, Any]]:
    """Server-side apply each object in order; CRDs are waited for before what follows them."""
    mapper = RestMapper(client)
    applied = []
    for obj in objects:
        path = await _path_when_served(mapper, obj, namespace)
        applied.append(await client.apply(path, obj, field_manager=field_manager))
        if obj["kind"] == "CustomResourceDefinition":
            await wait_crd_served(client, obj["metadata"]["name"])
    return applied


async def _path_when_served(mapper: RestMapper, obj: dict[str, Any], namespace: str | None) -> str:
    for attempt in range(50):
        try:
            return await mapper.path(obj, namespace=namespace)
        except LookupError:
            if attempt == 49:
                raise
            await asyncio.sleep(0.1)
    raise AssertionError("unreachable")


async def wait_crd_served(client: Client, name: str, *, timeout: float = 30.0) -> None:
    """Wait until the CRD is Established and its kind answers a list."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    async with asyncio.timeout(timeout):
        while True:
            crd = await client.get(path)
            conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            await asyncio.sleep(0.05)
        spec = crd["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("served", True))
        collection = f"/apis/{spec['group']}/{version}/{spec['names']['plural']}"
        while True:
            try:
                await client.list_objects(collection, params={"limit": 1})
                return
            except errors.NotFound:
                await asyncio.sleep(0.05)


async def install_crds(client: Client) -> None:
    """Install (or update) the chart's three CRDs and wait until they are served."""
    await apply_objects(client, load_files(crd_files()))


async def install_kubevirt_crds(client: Client) -> None:
    """Install (or update) the VirtualMachine and VirtualMachineInstance CRDs the KubeVirt stand-in serves."""
    await apply_objects(client, load_files(STANDIN_CRDS / name for name in KUBEVIRT_CRDS))
