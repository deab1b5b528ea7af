"""R-POL-2: the agent's service account writes only the GPUNode of the node its pod-bound token names."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client
from tests.policies import support as s
from tests.policies.conftest import PolicyPlane

pytestmark = pytest.mark.both_minors


def gpu_node(name: str) -> dict[str, Any]:
    return {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND, "metadata": {"name": name}}


@pytest.fixture
def node_a() -> str:
    return s.unique("node-a")


@pytest.fixture
def node_b() -> str:
    return s.unique("node-b")


@pytest.fixture
async def agent_on_a(plane: ControlPlane, admin: Client, policies: PolicyPlane, node_a: str) -> AsyncIterator[Client]:
    """The agent's service account with a token bound to its pod on node A (as kubelet would mount it)."""
    token = await plane.service_account_token(admin, namespace=s.RELEASE_NAMESPACE, service_account=s.AGENT_SA,
                                              node_name=node_a)
    async with plane.token_client(token) as client:
        yield client
    await s.delete_token_pods(admin, node_a)


@pytest.fixture
async def agent_unbound(plane: ControlPlane, admin: Client, policies: PolicyPlane) -> AsyncIterator[Client]:
    """The agent's service account with a token bound to no pod: no node-name extra."""
    token = await plane.service_account_token(admin, namespace=s.RELEASE_NAMESPACE, service_account=s.AGENT_SA)
    async with plane.token_client(token) as client:
        yield client


async def test_the_agent_writes_the_gpunode_of_its_own_node(
    agent_on_a: Client, node_a: str, cleanup: Callable[[str], None],
) -> None:
    await agent_on_a.create(s.NODES, gpu_node(node_a))
    cleanup(f"{s.NODES}/{node_a}")
    status = {"status": {"deviceCount": 1, "resourceNames": [s.GPU_NAME]}}
    updated = await agent_on_a.merge_patch(f"{s.NODES}/{node_a}/status", status)
    assert updated["status"]["resourceNames"] == [s.GPU_NAME]
    await agent_on_a.merge_patch(f"{s.NODES}/{node_a}", {"metadata": {"labels": {"reported": "yes"}}})


async def test_the_agent_cannot_create_another_node_s_gpunode(agent_on_a: Client, node_a: str, node_b: str) -> None:
    await s.refused(agent_on_a.create(s.NODES, gpu_node(node_b)),
                    f"the GPU agent on node {node_a} may write only GPUNode {node_a}",
                    f"CREATE of GPUNode {node_b} is refused")


async def test_the_agent_cannot_update_or_delete_another_node_s_gpunode(
    admin: Client, agent_on_a: Client, node_a: str, node_b: str, cleanup: Callable[[str], None],
) -> None:
    await admin.create(s.NODES, gpu_node(node_b))
    cleanup(f"{s.NODES}/{node_b}")
    path = f"{s.NODES}/{node_b}"
    await s.refused(agent_on_a.merge_patch(f"{path}/status", {"status": {"resourceNames": ["nvidia.com/forged"]}}),
                    f"UPDATE of GPUNode {node_b} is refused", node_a)
    await s.refused(agent_on_a.merge_patch(path, {"metadata": {"labels": {"forged": "yes"}}}),
                    f"UPDATE of GPUNode {node_b}")
    await s.refused(agent_on_a.delete(path), f"DELETE of GPUNode {node_b}")
    assert "resourceNames" not in (await admin.get(path)).get("status", {})


async def test_a_token_without_the_node_name_extra_is_refused_even_for_a_node_s_own_gpunode(
    admin: Client, agent_unbound: Client, node_a: str, cleanup: Callable[[str], None],
) -> None:
    no_node = "its token names no node"
    await s.refused(agent_unbound.create(s.NODES, gpu_node(node_a)),
                    f"the GPU agent system:serviceaccount:{s.RELEASE_NAMESPACE}:{s.AGENT_SA}", no_node,
                    keys.NODE_NAME_EXTRA, f"CREATE of GPUNode {node_a}")
    await admin.create(s.NODES, gpu_node(node_a))
    cleanup(f"{s.NODES}/{node_a}")
    await s.refused(agent_unbound.merge_patch(f"{s.NODES}/{node_a}/status", {"status": {"deviceCount": 1}}),
                    no_node)


async def test_other_identities_are_not_restricted_by_node(
    admin: Client, node_b: str, cleanup: Callable[[str], None],
) -> None:
    """The policy matches only the agent's service account (the binder writes every node's conditions)."""
    await admin.create(s.NODES, gpu_node(node_b))
    cleanup(f"{s.NODES}/{node_b}")
    await admin.merge_patch(f"{s.NODES}/{node_b}/status", {"status": {"conditions": [
        {"type": "Eligible", "status": "True", "reason": "Ready"}]}})
