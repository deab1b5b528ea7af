"""Fixtures of the admission policy tests: the chart's policies, applied once per control plane.

The chart is rendered with helm (GPU on, every matched kind served) and only
its ValidatingAdmissionPolicies and bindings are applied: the rest of the
chart (webhooks that fail closed, the controller) would change what other
suites on the same API server see. The bindings act in namespaces labelled as
Cozystack tenant namespaces, which only these tests create; the
cluster-scoped ones act only on objects these tests make (the agent's service
account, finalized classes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import pytest

from cozygpu import keys
from cozygpu.devcluster import apply, chart
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors
from tests.policies import support as s
from tests.support.crds import install_fixture_crd

POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
TOKEN_SECONDS = 6 * 3600


@attrs.define
class PolicyPlane:
    """What was set up once on one control plane."""

    objects: list[dict[str, Any]]
    probe_namespace: str
    tokens: dict[str, str]


async def install_policies(plane: ControlPlane, admin: Client) -> PolicyPlane:
    for namespace in (s.RELEASE_NAMESPACE, s.KUBEVIRT_NAMESPACE, "cozy-system"):
        await s.ensure_namespace(admin, namespace)
    await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
    await apply.apply_objects(admin, [s.settings_configmap()])
    rendered = await asyncio.to_thread(chart.render, {"gpu": {"enabled": True}}, kube_version=plane.minor)
    objects = [obj for obj in rendered if obj["kind"] in POLICY_KINDS]
    await apply.apply_objects(admin, objects)

    # The agent may write every GPUNode as far as RBAC goes, as in the chart's agent role.
    await apply.apply_objects(admin, [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "cozygpu-policy-tests-agent"},
         "rules": [{"apiGroups": [keys.GROUP], "resources": [keys.GPUNODE_PLURAL, f"{keys.GPUNODE_PLURAL}/status"],
                    "verbs": ["*"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "cozygpu-policy-tests-agent"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "cozygpu-policy-tests-agent"},
         "subjects": [{"kind": "ServiceAccount", "namespace": s.RELEASE_NAMESPACE, "name": s.AGENT_SA}]},
    ])
    tokens = {
        name: await plane.service_account_token(admin, namespace=ns, service_account=sa,
                                                expiration_seconds=TOKEN_SECONDS)
        for name, (ns, sa) in s.SERVICE_ACCOUNTS.items()
    }
    probe = await s.tenant_namespace(admin)
    await wait_until_every_policy_is_in_force(plane, admin, probe)
    return PolicyPlane(objects=objects, probe_namespace=probe, tokens=tokens)


async def wait_until_every_policy_is_in_force(plane: ControlPlane, admin: Client, probe: str) -> None:
    """One refused dry run per policy: each binding is enforced only after a short delay."""
    await s.in_force(
        lambda: admin.create(s.configmaps(probe), s.configmap("probe", labels={keys.USAGE_MONITOR_LABEL: "x"}),
                             dry_run=True),
        what="the usage-monitor label policy", says=keys.USAGE_MONITOR_LABEL)
    await s.in_force(lambda: admin.create(s.pods(probe), s.pod("probe", gpu=s.GPU_NAME), dry_run=True),
                     what="the raw-name pod policy", says=s.GPU_NAME)
    await s.in_force(lambda: admin.create(s.vmis(probe), s.vmi("probe", gpus=[s.GPU_NAME]), dry_run=True),
                     what="the raw-name VMI policy", says=s.GPU_NAME)
    async with plane.client(s.TENANT_USER, s.TENANT_GROUPS) as tenant:
        await s.in_force(
            lambda: tenant.create(s.devices(probe), s.gpu_device("probe", labels={keys.TEMPLATE_DEVICE_LABEL: "true"}),
                                  dry_run=True),
            what="the device protection policy", says=keys.TEMPLATE_DEVICE_LABEL)

    frozen = await admin.create(s.CLASSES, s.gpu_class(s.unique("probe-frozen")))
    deleting = await admin.create(s.CLASSES, s.gpu_class(s.unique("probe-deleting")))
    await admin.delete(f"{s.CLASSES}/{deleting['metadata']['name']}")
    try:
        await s.in_force(
            lambda: admin.merge_patch(f"{s.CLASSES}/{frozen['metadata']['name']}", {"spec": {"vendor": "AMD"}},
                                      **s.dry_run()),
            what="the class protection policy", says=keys.CLASS_FINALIZER)
        await s.in_force(
            lambda: admin.create(s.devices(probe), s.gpu_device("probe", class_name=deleting["metadata"]["name"]),
                                 dry_run=True),
            what="the deleting-class policy", says=deleting["metadata"]["name"])
    finally:
        for made in (frozen, deleting):
            await release_class(admin, made["metadata"]["name"])

    probe_node = s.unique("probe-node")
    token = await plane.service_account_token(admin, namespace=s.RELEASE_NAMESPACE, service_account=s.AGENT_SA,
                                              node_name=probe_node)
    async with plane.token_client(token) as agent:
        await s.in_force(
            lambda: agent.create(s.NODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                                           "metadata": {"name": "another-node"}}, dry_run=True),
            what="the agent node policy", says="another-node")
    await s.delete_token_pods(admin, probe_node)


async def release_class(admin: Client, name: str) -> None:
    """Drop a test class's finalizers and delete it, so other suites never list it."""
    path = f"{s.CLASSES}/{name}"
    try:
        await admin.merge_patch(path, {"metadata": {"finalizers": None}})
        await admin.delete(path)
    except errors.NotFound:
        pass


@pytest.fixture(scope="session")
def _policy_planes() -> dict[str, PolicyPlane]:
    return {}


@pytest.fixture
async def policies(plane: ControlPlane, admin: Client, _policy_planes: dict[str, PolicyPlane]) -> PolicyPlane:
    """The chart's policies in force on this plane (applied on first use, then kept)."""
    key = str(plane.directory)
    if key not in _policy_planes:
        _policy_planes[key] = await install_policies(plane, admin)
    return _policy_planes[key]


@pytest.fixture
async def tenant_ns(admin: Client, policies: PolicyPlane) -> str:
    """A fresh tenant namespace (labelled as Cozystack labels them) in which everyone has RBAC."""
    return await s.tenant_namespace(admin)


@pytest.fixture
async def plain_ns(admin: Client, policies: PolicyPlane) -> str:
    """A fresh namespace that is not a tenant's, with the same RBAC."""
    return await s.tenant_namespace(admin, tenant=False)


@attrs.define
class Callers:
    """Clients acting as the identities the policies tell apart."""

    tenant: Client
    platform: dict[str, Client]
    kubevirt_controller: Client


@pytest.fixture
async def callers(plane: ControlPlane, admin: Client, policies: PolicyPlane) -> AsyncIterator[Callers]:
    made: list[Client] = []

    def keep(client: Client) -> Client:
        made.append(client)
        return client

    tokens = policies.tokens
    result = Callers(
        tenant=keep(plane.client(s.TENANT_USER, s.TENANT_GROUPS)),
        platform={
            "system:masters": admin,
            "a cozy-system service account": keep(plane.token_client(tokens["cozy-system"])),
            "a kube-system service account": keep(plane.token_client(tokens["kube-system"])),
            "kube-controller-manager": keep(plane.client(s.KCM_USER, ("system:authenticated",))),
            "the cozygpu controller": keep(plane.token_client(tokens["cozygpu-controller"])),
        },
        kubevirt_controller=keep(plane.token_client(tokens["kubevirt-controller"])),
    )
    yield result
    for client in made:
        await client.close()


@pytest.fixture
async def cleanup(admin: Client) -> AsyncIterator[Callable[[str], None]]:
    """``cleanup(path)``: strip the object's finalizers and delete it after the test.

    The API server is shared by every suite of the session; devices, classes,
    nodes and pods left behind would show up in other suites' listings.
    """
    paths: list[str] = []
    yield paths.append
    for path in reversed(paths):
        try:
            await admin.merge_patch(path, {"metadata": {"finalizers": None}})
            await admin.delete(path, grace_period_seconds=0)
        except errors.NotFound:
            continue


@attrs.define
class Settings:
    """The settings ConfigMap (the raw-name policies' parameter), shared by the plane."""

    admin: Client
    probe_namespace: str

    async def write(self, *, raw_names: str) -> None:
        await apply.apply_objects(self.admin, [s.settings_configmap(raw_names=raw_names)])

    async def delete(self) -> None:
        await self.admin.delete(s.settings_path())

    async def forbid_in_force(self) -> None:
        """Wait until a GPU pod is refused by the policy's own check (the parameter read, rawNames forbid)."""
        await s.in_force(
            lambda: self.admin.create(s.pods(self.probe_namespace), s.pod("probe", gpu=s.GPU_NAME), dry_run=True),
            what="raw names forbidden by the settings ConfigMap", says=f"container compute requests {s.GPU_NAME}")


@pytest.fixture
async def settings(admin: Client, policies: PolicyPlane) -> AsyncIterator[Settings]:
    """The settings ConfigMap, put back to forbid (and waited for) after the test."""
    handle = Settings(admin, policies.probe_namespace)
    yield handle
    await handle.write(raw_names=keys.RAW_NAMES_FORBID)
    await handle.forbid_in_force()

