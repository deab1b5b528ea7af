"""The CRDs of SPEC §1.1–1.3, enforced by the real API server of both minors."""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.devcluster import binaries
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path

pytestmark = pytest.mark.both_minors

CLASSES = resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL)
NODES = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)


def devices(namespace: str) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=namespace)


def unique(prefix: str) -> str:
    return f"{prefix}-{os.urandom(4).hex()}"


def passthrough_class(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPUCLASS_KIND,
        "metadata": {"name": name},
        "spec": {
            "vendor": "NVIDIA",
            "model": "H100 SXM5 80GB",
            "mode": "Passthrough",
            "memory": "80Gi",
            "resourceName": "nvidia.com/GH100_H100_SXM5_80GB",
            "source": {"devicePlugin": {}},
        },
    }
    body["spec"].update(spec)
    return body


def vgpu_class(name: str, **spec: Any) -> dict[str, Any]:
    body = passthrough_class(name, mode="VGPU", profile="H100-4C", memory="4Gi",
                             resourceName="nvidia.com/NVIDIA_H100-4C")
    body["spec"].update(spec)
    return body


def device(name: str, *, class_name: str = "h100", count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPUDEVICE_KIND,
        "metadata": {"name": name},
        "spec": {"className": class_name, "count": count},
    }


async def refused(coro: Any, *, says: str) -> errors.ApiError:
    with pytest.raises(errors.Invalid) as caught:
        await coro
    assert says in caught.value.message, caught.value.message
    return caught.value


# -- GPUClass ------------------------------------------------------------------------------


async def test_a_valid_passthrough_class_and_a_valid_vgpu_class_are_accepted(admin: Client) -> None:
    made = await admin.create(CLASSES, passthrough_class(unique("h100")))
    assert made["spec"]["onCordon"] == "Move", "onCordon defaults to Move"
    assert "maxCount" not in made["spec"], "maxCount has no schema default (readers resolve it)"
    made = await admin.create(CLASSES, vgpu_class(unique("h100-4c"), maxCount=1))
    assert made["spec"]["profile"] == "H100-4C"


async def test_a_class_named_total_is_refused(admin: Client) -> None:
    await refused(admin.create(CLASSES, passthrough_class("total")), says="cannot be named 'total'")


@pytest.mark.parametrize("name", ["h100.sxm", "a" * 64, "gpu.h100.x"])
async def test_a_class_name_that_is_not_a_dns_label_is_refused(admin: Client, name: str) -> None:
    await refused(admin.create(CLASSES, passthrough_class(name)), says="must be a DNS label")


async def test_a_dra_source_is_a_member_with_its_device_class_selectors_and_match_attribute(admin: Client) -> None:
    dra = {"deviceClassName": "vfio.gpu.nvidia.com", "selectors": [{"cel": {"expression": "device.driver == 'x'"}}],
           "matchAttribute": "resource.kubernetes.io/pcieRoot"}
    made = await admin.create(CLASSES, passthrough_class(unique("dra"), source={"dra": dra}))
    assert made["spec"]["source"] == {"dra": dra}
    implicit = "deviceclass.resource.kubernetes.io/vfio.gpu.nvidia.com"
    made = await admin.create(CLASSES, passthrough_class(unique("dra"), source={"dra": dra}, resourceName=implicit))
    assert made["spec"]["resourceName"] == implicit, "a DeviceClass's implicit extended name, sold by its DRA class"


@pytest.mark.parametrize("source", [{"devicePlugin": {}}, {"dra": {"deviceClassName": "other.example.com"}}])
async def test_a_device_class_name_is_sold_only_by_a_dra_class_of_that_device_class(
        admin: Client, source: dict[str, Any]) -> None:
    body = passthrough_class(unique("dra"), source=source,
                             resourceName="deviceclass.resource.kubernetes.io/vfio.gpu.nvidia.com")
    await refused(admin.create(CLASSES, body), says="is a DeviceClass's implicit extended resource name")


@pytest.mark.parametrize(("dra", "says"), [
    ({}, "deviceClassName: Required value"),
    ({"deviceClassName": "vfio.gpu.nvidia.com", "matchAttribute": "pcieRoot"}, "must be a qualified name"),
    ({"deviceClassName": "vfio.gpu.nvidia.com", "selectors": [{"cel": {}}]}, "expression: Required value"),
])
async def test_a_dra_source_without_its_device_class_or_with_a_bad_field_is_refused(
        admin: Client, dra: dict[str, Any], says: str) -> None:
    await refused(admin.create(CLASSES, passthrough_class(unique("dra"), source={"dra": dra})), says=says)


async def test_an_empty_source_is_refused(admin: Client) -> None:
    await refused(admin.create(CLASSES, passthrough_class(unique("empty"), source={})),
                  says="exactly one member")


async def test_a_source_with_two_members_is_refused(admin: Client) -> None:
    body = passthrough_class(unique("two"), source={"devicePlugin": {}, "dra": {"deviceClassName": "x"}})
    await refused(admin.create(CLASSES, body), says="exactly one member")


async def test_a_resource_name_in_the_budget_domain_is_refused(admin: Client) -> None:
    body = passthrough_class(unique("budget"), resourceName="gpu.cozystack.io/h100")
    await refused(admin.create(CLASSES, body), says="would read as a GPU budget key")


@pytest.mark.parametrize("resource_name", ["H100", "nvidia.com/", "nvidia.com/a/b", "Nvidia.com/h100",
                                           "nvidia.com/" + "x" * 64])
async def test_an_invalid_resource_name_is_refused(admin: Client, resource_name: str) -> None:
    body = passthrough_class(unique("bad"), resourceName=resource_name)
    await refused(admin.create(CLASSES, body), says="must be an extended resource name")


async def test_a_resource_name_in_the_kubernetes_domain_is_refused(admin: Client) -> None:
    body = passthrough_class(unique("k8s"), resourceName="kubernetes.io/gpu")
    await refused(admin.create(CLASSES, body), says="kubernetes.io domain")


async def test_max_count_zero_is_refused(admin: Client) -> None:
    with pytest.raises(errors.Invalid) as caught:
        await admin.create(CLASSES, passthrough_class(unique("zero"), maxCount=0))
    assert "spec.maxCount" in caught.value.message
    assert "greater than or equal to 1" in caught.value.message


async def test_a_vgpu_class_without_a_profile_is_refused(admin: Client) -> None:
    body = vgpu_class(unique("noprofile"))
    del body["spec"]["profile"]
    await refused(admin.create(CLASSES, body), says="spec.profile is required for mode VGPU")


async def test_a_passthrough_class_with_a_profile_is_refused(admin: Client) -> None:
    body = passthrough_class(unique("profiled"), profile="H100-4C")
    await refused(admin.create(CLASSES, body), says="spec.profile is forbidden for mode Passthrough")


# -- GPUDevice -----------------------------------------------------------------------------


async def test_a_device_of_count_zero_is_refused(admin: Client, namespace: str) -> None:
    with pytest.raises(errors.Invalid) as caught:
        await admin.create(devices(namespace), device("zero", count=0))
    assert "spec.count" in caught.value.message


@pytest.mark.parametrize(("field", "value"), [("className", "a100"), ("count", 2)])
async def test_any_change_to_a_device_spec_is_refused(
    admin: Client, namespace: str, field: str, value: object
) -> None:
    made = await admin.create(devices(namespace), device("held"))
    path = f"{devices(namespace)}/held"
    await refused(admin.merge_patch(path, {"spec": {field: value}}), says="spec is immutable")
    changed = copy.deepcopy(made)
    changed["spec"][field] = value
    await refused(admin.replace(path, changed), says="spec is immutable")
    assert (await admin.get(path))["spec"] == made["spec"]


async def test_a_field_selector_on_node_name_lists_exactly_the_devices_bound_there(
    admin: Client, namespace: str
) -> None:
    placement = {"a": "node-1", "b": "node-2", "c": "node-1", "d": None}
    for name, node in placement.items():
        await admin.create(devices(namespace), device(name))
        if node is not None:
            await admin.merge_patch(f"{devices(namespace)}/{name}/status",
                                    {"status": {"phase": "Bound", "nodeName": node}})
    for node in ("node-1", "node-2", "node-3"):
        listed = await admin.list_objects(devices(namespace), params={"fieldSelector": f"status.nodeName={node}"})
        names = sorted(item["metadata"]["name"] for item in listed["items"])
        assert names == sorted(n for n, where in placement.items() if where == node)
    everywhere = await admin.list_objects(
        resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL),
        params={"fieldSelector": "status.nodeName=node-1"},
    )
    assert {i["metadata"]["name"] for i in everywhere["items"] if i["metadata"]["namespace"] == namespace} == {"a", "c"}


async def test_device_status_is_written_only_through_the_status_subresource(admin: Client, namespace: str) -> None:
    await admin.create(devices(namespace), {**device("s"), "status": {"phase": "Bound", "nodeName": "n"}})
    path = f"{devices(namespace)}/s"
    assert (await admin.get(path))["status"] == {"phase": "Pending"}, "only the schema's default"
    await admin.merge_patch(path, {"status": {"phase": "Bound"}})
    assert (await admin.get(path))["status"] == {"phase": "Pending"}


async def test_a_new_order_reads_pending_before_the_binder_has_seen_it(admin: Client, namespace: str) -> None:
    made = await admin.create(devices(namespace), device("fresh"))
    assert made["status"] == {"phase": "Pending"}
    listed = await admin.list_objects(devices(namespace), params={"fieldSelector": "status.phase=Pending"})
    assert [i["metadata"]["name"] for i in listed["items"]] == ["fresh"]


# -- printer columns -----------------------------------------------------------------------

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


async def table(admin: Client, path: str) -> dict[str, Any]:
    return await admin.get(path, headers={"Accept": TABLE})


async def test_the_servers_tables_carry_the_printer_columns(admin: Client, namespace: str) -> None:
    name = unique("cols")
    await admin.create(CLASSES, passthrough_class(name))
    await admin.merge_patch(f"{CLASSES}/{name}/status", {"status": {"units": 8, "held": 3, "free": 5}})
    await admin.create(devices(namespace), device("cols", class_name=name, count=2))
    await admin.merge_patch(f"{CLASSES}/{name}/status", {"status": {"conditions": [condition(
        "Available", "False", "AllHeld", "all 8 units on 1 eligible node(s) are held or in use")]}})
    await admin.merge_patch(f"{devices(namespace)}/cols/status", {"status": {
        "phase": "Bound", "nodeName": "gpu-1", "attachment": {"vmi": "vm-a"}, "heldSince": "2026-12-01T10:00:00Z",
        "idleSince": "2026-12-02T09:00:00Z", "idleSeconds": 60,
        "conditions": [condition("Bound", "True", "Moved", "moved from node gpu-0 to node gpu-1: cordoned")]}})
    await admin.create(devices(namespace), device("waits", class_name=name, count=4))
    await admin.merge_patch(f"{devices(namespace)}/waits/status", {"status": {"conditions": [condition(
        "Bound", "False", "BudgetExceeded", "not accepted: budget gpu.cozystack.io/total of t: 2 allowed")]}})
    await admin.create(NODES, {"apiVersion": keys.API_VERSION, "kind": keys.GPUNODE_KIND,
                               "metadata": {"name": name}})
    await admin.merge_patch(f"{NODES}/{name}/status", {"status": {
        "deviceCount": 2, "allocatable": 9, "agent": {"lastReport": "2026-12-02T10:00:00Z"},
        "conditions": [condition("Eligible", "False", "NodeCordoned", "the Node is cordoned")]}})

    expected = {
        f"{CLASSES}/{name}": (["Name", "Mode", "Model", "Resource", "Units", "Free", "Held", "Age", "Available",
                               "Message"],
                              [name, "Passthrough", "H100 SXM5 80GB", "nvidia.com/GH100_H100_SXM5_80GB", 8, 5, 3]),
        f"{devices(namespace)}/cols": (["Name", "Class", "Count", "Phase", "Node", "VMI", "Reason", "Age", "Held",
                                        "Idle", "Message"],
                                       ["cols", name, 2, "Bound", "gpu-1", "vm-a", "Moved"]),
        f"{devices(namespace)}/waits": (["Name", "Class", "Count", "Phase", "Node", "VMI", "Reason", "Age", "Held",
                                         "Idle", "Message"],
                                        ["waits", name, 4, "Pending", None, None, "BudgetExceeded"]),
        f"{NODES}/{name}": (["Name", "Devices", "Allocatable", "Eligible", "Last report", "Age", "Message"],
                            [name, 2, 9, "NodeCordoned"]),
    }
    for path, (columns, cells) in expected.items():
        answer = await table(admin, path)
        assert [c["name"] for c in answer["columnDefinitions"]] == columns
        assert answer["rows"][0]["cells"][: len(cells)] == cells
        # The condition's message is there too, for `kubectl get -o wide`.
        assert answer["columnDefinitions"][-1]["priority"] == 1
        assert answer["rows"][0]["cells"][-1]
    # Held and Idle read heldSince and idleSince (R-LEDGER-1), shown as ages; an order not held has neither.
    held, idle = (await table(admin, f"{devices(namespace)}/cols"))["rows"][0]["cells"][8:10]
    assert isinstance(held, str)
    assert isinstance(idle, str)
    assert held != idle, "a day apart"
    assert (await table(admin, f"{devices(namespace)}/waits"))["rows"][0]["cells"][8:10] == [None, None]


def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-12-02T10:00:00Z"}


async def test_kubectl_get_shows_the_printer_columns(plane: ControlPlane, admin: Client, namespace: str) -> None:
    kubectl = binaries.cache_dir() / "bin" / f"kubernetes-{binaries.KUBERNETES[binaries.DEFAULT_MINOR]}" / "kubectl"
    if not kubectl.exists():
        pytest.fail("kubectl is built with the current minor's binaries; run `python -m cozygpu.devcluster.binaries`")
    await admin.create(devices(namespace), device("shown", class_name="h100", count=3))
    proc = await asyncio.to_thread(
        subprocess.run,
        [str(kubectl), "--kubeconfig", str(plane.kubeconfig), "get", "gpudevices", "-n", namespace],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "CLASS", "COUNT", "PHASE", "NODE", "VMI", "REASON", "AGE", "HELD", "IDLE"]
    assert row.split()[:3] == ["shown", "h100", "3"]
