"""``kubectl gpu`` as a person runs it: the installed executables against the real API server, and real kubectl.

The plugin and ``cozygpu`` run as processes of their own from the venv's
bin directory (where ``pip install`` puts both console scripts), kubectl
finds ``kubectl-gpu`` on the PATH as it finds any plugin, and the kubeconfig
comes from ``$KUBECONFIG`` for kubectl's spelling and from ``--kubeconfig``
for cozygpu's.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cozygpu import keys
from cozygpu.devcluster import binaries
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, resource_path
from tests.binder.world import World
from tests.support.planes import unavailable

BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-gpu"


async def run(*argv: str | Path, env: Mapping[str, str] | None = None) -> str:
    """The command's stdout; it must end with exit code 0."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, f"{argv}: exit code {process.returncode}: {err.decode()}"
    return out.decode()


@pytest.fixture
def plugin() -> Path:
    if not PLUGIN.exists():
        pytest.fail(f"{PLUGIN} is not installed: reinstall the package (pip install -e .)", pytrace=False)
    return PLUGIN


@pytest.fixture
async def world(admin: Client) -> AsyncIterator[World]:
    """A tenant with a total budget of 2, and a class of the test's own served by one Ready node with 3 units."""
    tenant = f"tenant-{uuid.uuid4().hex[:8]}"
    await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": tenant}})
    await admin.create(resource_path("", "v1", "resourcequotas", namespace=tenant), {
        "metadata": {"name": keys.TENANT_QUOTA_NAME}, "spec": {"hard": {keys.QUOTA_TOTAL: "2"}}})
    world = await World.make(admin, tenant)
    try:
        await world.node("n1", 3)
        yield world
    finally:
        await world.cleanup()


def our_row(answer: dict[str, Any], world: World) -> dict[str, Any]:
    row: dict[str, Any] = next(r for r in answer["classes"] if r["class"] == world.gpu_class)
    return row


async def test_kubectl_gpu_catalog_answers_as_cozygpu_catalog_does_in_json_and_in_yaml(
        plane: ControlPlane, plugin: Path, world: World) -> None:
    namespace = world.namespace
    kubectl_env = {"KUBECONFIG": str(plane.kubeconfig)}

    cozygpu = json.loads(await run(BIN / "cozygpu", "catalog", "--namespace", namespace, "--output", "json",
                                   "--kubeconfig", plane.kubeconfig))
    as_json = json.loads(await run(plugin, "catalog", "-n", namespace, "-o", "json", env=kubectl_env))
    as_yaml = yaml.safe_load(await run(plugin, "-n", namespace, "catalog", "-o", "yaml", env=kubectl_env))

    assert as_json == cozygpu
    assert as_yaml == cozygpu
    row = our_row(cozygpu, world)
    assert (row["freeInCluster"], row["bestNode"], row["orderable"]) == (3, world.node_name("n1"), 2)
    assert row["budgetLeft"] == f"2 ({keys.QUOTA_TOTAL} of {namespace})"


async def test_kubectl_finds_the_plugin_on_the_path_and_runs_it_with_its_flags(
        plane: ControlPlane, plugin: Path, world: World) -> None:
    found = binaries.find()
    if found is None or found.kubectl is None:
        unavailable("kubectl is not built")
        return
    kubectl = found.kubectl
    env = {"PATH": str(plugin.parent), "KUBECONFIG": str(plane.kubeconfig)}

    listed = await run(kubectl, "plugin", "list", env=env)
    helped = await run(kubectl, "gpu", "--help", env=env)
    answer = json.loads(await run(kubectl, "gpu", "-n", world.namespace, "catalog", "-o", "json", env=env))

    assert str(plugin) in listed.splitlines()
    assert helped.startswith("usage: kubectl gpu COMMAND [flags]\n")
    assert answer["namespace"] == world.namespace
    assert our_row(answer, world)["freeInCluster"] == 3
