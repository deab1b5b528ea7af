"""``kubectl explain`` has a description for every field of the three CRDs, read back from the API server.

Two readings: the CRD objects as the server stores them (``openAPIV3Schema``),
and the OpenAPI v3 document the server publishes from them, which is what
``kubectl explain`` reads. A description cut short (a comma in an unquoted
YAML flow mapping ends the value) fails too: every description is a sentence
that ends with a full stop.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.devcluster import binaries
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client

pytestmark = pytest.mark.both_minors

CRDS = {
    keys.GPUCLASS_KIND: f"{keys.GPUCLASS_PLURAL}.{keys.GROUP}",
    keys.GPUDEVICE_KIND: f"{keys.GPUDEVICE_PLURAL}.{keys.GROUP}",
    keys.GPUNODE_KIND: f"{keys.GPUNODE_PLURAL}.{keys.GROUP}",
}


#: Fields the API server describes itself in what it publishes (its text ends with a link).
STANDARD = frozenset({"apiVersion", "kind"})


def fields(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every field below ``schema`` with its schema: properties, list items, map values."""
    for name, sub in (schema.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        yield where, sub
        yield from fields(sub, where)
    items = schema.get("items")
    if isinstance(items, Mapping):
        yield from fields(items, path + "[]")
    values = schema.get("additionalProperties")
    if isinstance(values, Mapping):
        yield from fields(values, path + "{}")


def problems(schema: Mapping[str, Any]) -> list[str]:
    found = []
    for path, sub in fields(schema):
        if path == "metadata" or "$ref" in sub or "allOf" in sub:
            # Kubernetes' own ObjectMeta: a CRD may not describe it, explain shows its own description.
            continue
        text = str(sub.get("description") or "").strip()
        if not text:
            found.append(f"{path}: <no description>")
        elif path not in STANDARD and not text.endswith((".", ".)")):
            found.append(f"{path}: {text!r} is cut short (no closing full stop)")
    return found


@pytest.mark.parametrize("kind", sorted(CRDS))
async def test_every_field_of_the_stored_crd_has_a_whole_description(admin: Client, kind: str) -> None:
    crd = await admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRDS[kind]}")
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        assert schema.get("description"), f"{kind} {version['name']}: the kind itself has no description"
        assert problems(schema) == [], f"{kind} {version['name']}"
        assert sum(1 for _ in fields(schema)) > 10, "the walk reached the nested fields"


async def published(admin: Client, kind: str) -> Mapping[str, Any]:
    """The OpenAPI v3 document of the group once it describes ``kind`` (the server publishes a new CRD late)."""
    name = f"io.cozystack.gpu.{keys.VERSION}.{kind}"
    async with asyncio.timeout(60):
        while True:
            document = await admin.get_or_none(f"/openapi/v3/apis/{keys.GROUP}/{keys.VERSION}")
            if document is not None and name in document.get("components", {}).get("schemas", {}):
                return document
            await asyncio.sleep(0.5)


@pytest.mark.parametrize("kind", sorted(CRDS))
async def test_every_field_kubectl_explain_reads_has_a_whole_description(admin: Client, kind: str) -> None:
    document = await published(admin, kind)
    schemas = document["components"]["schemas"]
    name = f"io.cozystack.gpu.{keys.VERSION}.{kind}"
    assert name in schemas, sorted(schemas)
    assert problems(schemas[name]) == [], kind


async def test_descriptions_cut_at_a_comma_read_whole(admin: Client) -> None:
    document = await published(admin, keys.GPUNODE_KIND)
    device = document["components"]["schemas"][f"io.cozystack.gpu.{keys.VERSION}.GPUNode"][
        "properties"]["status"]["properties"]["devices"]["items"]["properties"]
    assert device["driver"]["description"] == "The bound driver, empty when unbound."
    assert device["allocated"]["description"] == "Of those, devices held by pods not in a final phase."
    assert set(device) >= {"address", "driver", "allocated"}
    assert not any(" " in key for key in device), "no sentence fragment became a field"


def test_the_walk_finds_a_missing_and_a_cut_description() -> None:
    schema = {"properties": {"a": {"type": "string", "description": "Whole."},
                             "b": {"type": "array", "description": "List.",
                                   "items": {"properties": {"c": {"type": "string"}}}},
                             "d": {"type": "string", "description": "The bound driver"}}}
    assert problems(schema) == ["b[].c: <no description>",
                                "d: 'The bound driver' is cut short (no closing full stop)"]


async def test_kubectl_explain_prints_the_whole_descriptions(plane: ControlPlane, admin: Client) -> None:
    kubectl = binaries.cache_dir() / "bin" / f"kubernetes-{binaries.KUBERNETES[binaries.DEFAULT_MINOR]}" / "kubectl"
    if not kubectl.exists():
        pytest.fail("kubectl is built with the current minor's binaries; run `python -m cozygpu.devcluster.binaries`")
    await published(admin, keys.GPUNODE_KIND)
    shown = {}
    for field in ("gpunode.status.devices.driver", "gpudevice.status.bindAnswer.reason", "gpuclass.status.held"):
        proc = await asyncio.to_thread(
            subprocess.run, [str(kubectl), "--kubeconfig", str(plane.kubeconfig), "explain", field],
            capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        shown[field] = " ".join(proc.stdout.split())
    assert "The bound driver, empty when unbound." in shown["gpunode.status.devices.driver"]
    assert "A CamelCase reason (for example Bound, StaysOnCordonedNode, NoNodeWithRoom)." in \
        shown["gpudevice.status.bindAnswer.reason"]
    assert "<no description>" not in " ".join(shown.values())
