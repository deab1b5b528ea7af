"""R-POL-3: nobody adds the usage-monitor key to anything in a tenant namespace; labelled objects ratchet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.kube import Client
from tests.policies import support as s
from tests.policies.conftest import Callers

pytestmark = pytest.mark.both_minors

KEY = keys.USAGE_MONITOR_LABEL
LABELLED = {KEY: "gpu", "app": "web"}

#: kind -> (collection path in a namespace, an object of that kind)
KINDS: dict[str, tuple[Callable[[str], str], Callable[..., dict[str, Any]]]] = {
    "ConfigMap": (s.configmaps, lambda name, **kw: s.configmap(name, **kw)),
    "Secret": (s.secrets, lambda name, **kw: {"apiVersion": "v1", "kind": "Secret",
                                              "metadata": s.metadata(name, **kw), "stringData": {"k": "v"}}),
    "Pod": (s.pods, lambda name, **kw: s.pod(name, **kw)),
    "GPUDevice": (s.devices, lambda name, **kw: s.gpu_device(name, **kw)),
    "VirtualMachineInstance": (s.vmis, lambda name, **kw: s.vmi(name, **kw)),
}


@pytest.mark.parametrize("kind", KINDS)
async def test_creating_an_object_with_the_key_is_refused_even_for_a_cluster_admin(
    admin: Client, tenant_ns: str, kind: str,
) -> None:
    collection, make = KINDS[kind]
    name = s.unique("labelled")
    await s.refused(admin.create(collection(tenant_ns), make(name, labels=LABELLED)),
                    "adding the label", KEY, f"{tenant_ns}/{name}", "selector of the GPU usage monitor")


async def test_a_tenant_creating_an_object_with_the_key_is_refused(callers: Callers, tenant_ns: str) -> None:
    await s.refused(callers.tenant.create(s.configmaps(tenant_ns), s.configmap("mine", labels=LABELLED)),
                    "adding the label", KEY, "configmaps")


async def test_objects_with_other_labels_are_created_as_usual(
    callers: Callers, tenant_ns: str, cleanup: Callable[[str], None],
) -> None:
    made = await callers.tenant.create(s.configmaps(tenant_ns), s.configmap("plain", labels={"app": "web"}))
    cleanup(f"{s.configmaps(tenant_ns)}/plain")
    assert made["metadata"]["labels"] == {"app": "web"}


@pytest.mark.parametrize("kind", ["ConfigMap", "Pod", "GPUDevice"])
async def test_adding_the_key_to_an_existing_object_is_refused(
    admin: Client, tenant_ns: str, kind: str, cleanup: Callable[[str], None],
) -> None:
    collection, make = KINDS[kind]
    name = s.unique("plain")
    await admin.create(collection(tenant_ns), make(name, labels={"app": "web"}))
    path = f"{collection(tenant_ns)}/{name}"
    cleanup(path)
    await s.refused(admin.merge_patch(path, {"metadata": {"labels": {KEY: "gpu"}}}),
                    "adding the label", KEY, f"{tenant_ns}/{name}")


async def test_a_pod_binding_carrying_the_key_is_refused(
    admin: Client, tenant_ns: str, cleanup: Callable[[str], None],
) -> None:
    """A subresource write (pods/binding) is a write in the namespace like any other."""
    await admin.create(s.pods(tenant_ns), s.pod("bound"))
    cleanup(f"{s.pods(tenant_ns)}/bound")
    binding: dict[str, Any] = {"apiVersion": "v1", "kind": "Binding",
                               "metadata": {"name": "bound", "labels": {KEY: "gpu"}},
                               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"}}
    await s.refused(admin.create(f"{s.pods(tenant_ns)}/bound/binding", binding),
                    "adding the label", KEY, f"pods/binding {tenant_ns}/bound")
    del binding["metadata"]["labels"]
    await admin.create(f"{s.pods(tenant_ns)}/bound/binding", binding)
    assert (await admin.get(f"{s.pods(tenant_ns)}/bound"))["spec"]["nodeName"] == "node-a"


async def test_the_key_in_a_namespace_that_is_no_tenant_s_is_left_alone(
    admin: Client, plain_ns: str, cleanup: Callable[[str], None],
) -> None:
    await admin.create(s.configmaps(plain_ns), s.configmap("labelled", labels=LABELLED))
    cleanup(f"{s.configmaps(plain_ns)}/labelled")


class TestAnObjectLabelledBeforeThePolicy:
    """Ratchet: an object carrying the key since before its namespace became a tenant's."""

    @pytest.fixture
    async def labelled(self, admin: Client, plain_ns: str, cleanup: Callable[[str], None]) -> str:
        """A ConfigMap with the key and a finalizer, in a namespace that then becomes a tenant namespace."""
        path = f"{s.configmaps(plain_ns)}/legacy"
        await admin.create(s.configmaps(plain_ns),
                           s.configmap("legacy", labels=LABELLED, finalizers=["example.com/keep"]))
        cleanup(path)
        tenant_label = {"metadata": {"labels": {keys.TENANT_NAMESPACE_LABEL: ""}}}
        await admin.merge_patch(f"{s.NAMESPACES}/{plain_ns}", tenant_label)
        await s.in_force(
            lambda: admin.create(s.configmaps(plain_ns), s.configmap("probe", labels=LABELLED), dry_run=True),
            what=f"the usage-monitor policy in {plain_ns}", says=KEY)
        return path

    async def test_it_can_still_be_updated(self, admin: Client, labelled: str) -> None:
        updated = await admin.merge_patch(labelled, {"metadata": {"labels": {"app": "api"}}, "data": {"k": "w"}})
        assert updated["metadata"]["labels"][KEY] == "gpu"

    async def test_it_can_lose_its_finalizers(self, admin: Client, labelled: str) -> None:
        updated = await admin.merge_patch(labelled, {"metadata": {"finalizers": None}})
        assert not updated["metadata"].get("finalizers")

    async def test_it_can_drop_the_key(self, callers: Callers, labelled: str) -> None:
        updated = await callers.tenant.merge_patch(labelled, {"metadata": {"labels": {KEY: None}}})
        assert KEY not in updated["metadata"]["labels"]

    async def test_the_key_s_value_cannot_change(self, admin: Client, labelled: str) -> None:
        await s.refused(admin.merge_patch(labelled, {"metadata": {"labels": {KEY: "other"}}}),
                        "changing the value of the label", KEY, "legacy")

    async def test_the_key_cannot_come_back_once_dropped(self, admin: Client, labelled: str) -> None:
        await admin.merge_patch(labelled, {"metadata": {"labels": {KEY: None}}})
        await s.refused(admin.merge_patch(labelled, {"metadata": {"labels": {KEY: "gpu"}}}), "adding the label")
