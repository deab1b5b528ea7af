"""Usage records against the real API server: they follow the holds (R-BIND-9)."""

from __future__ import annotations

from typing import Any

from cozygpu import keys
from cozygpu.api.workloads import MONITOR_NAME
from cozygpu.binder.patcher import Sent, send
from cozygpu.binder.usage import monitor_path, usage_plan, usage_writes, workload_path
from cozygpu.kube import Client
from cozygpu.passes.writes import Writes
from tests.binder.support import class_path, device_path, items, offer, order, unique
from tests.support.crds import install_fixture_crd


async def reconcile(admin: Client, namespace: str) -> Sent:
    await install_fixture_crd(admin, "workloadmonitors.cozystack.io")
    await install_fixture_crd(admin, "workloads.cozystack.io")
    plan = usage_plan(await items(admin, device_path(namespace)), await items(admin, class_path()),
                      await items(admin, monitor_path(namespace)), await items(admin, workload_path(namespace)))
    return await send(admin, usage_writes(plan), Writes())


async def records(admin: Client, namespace: str) -> dict[str, Any]:
    return {w["metadata"]["name"]: w["status"] for w in await items(admin, workload_path(namespace))}


async def test_records_follow_holds_and_go_with_the_device(admin: Client, namespace: str) -> None:
    name = unique("h100")
    await offer(admin, name, resource_name="nvidia.com/TEST")
    await order(admin, namespace, "d1", class_name=name, count=2, status={"phase": "Bound", "nodeName": "n1"})
    await order(admin, namespace, "waiting", class_name=name)
    await reconcile(admin, namespace)
    (monitor,) = await items(admin, monitor_path(namespace))
    assert monitor["metadata"]["name"] == MONITOR_NAME
    assert monitor["spec"]["selector"] == {keys.USAGE_MONITOR_LABEL: "gpu"}
    assert await records(admin, namespace) == {
        "gpudevice-d1": {"kind": "GPUDevice", "type": name, "resources": {"nvidia.com/TEST": "2"},
                         "operational": True}}

    await admin.merge_patch(device_path(namespace, "d1", status=True), {"status": {"phase": "Lost", "nodeName": None}})
    await reconcile(admin, namespace)
    assert (await records(admin, namespace))["gpudevice-d1"]["operational"] is False

    assert (await reconcile(admin, namespace)).written == ()
    await admin.delete(device_path(namespace, "d1"))
    await reconcile(admin, namespace)
    assert await records(admin, namespace) == {}
    assert await items(admin, monitor_path(namespace)) == []
    await admin.delete(class_path(name))


async def test_a_namespace_being_deleted_gets_no_record_and_fails_no_pass(admin: Client) -> None:
    """Without a namespace controller the namespace stays Terminating: creating in it is refused (403)."""
    await install_fixture_crd(admin, "workloadmonitors.cozystack.io")
    await install_fixture_crd(admin, "workloads.cozystack.io")
    doomed = unique("doomed")
    await admin.create("/api/v1/namespaces", {"metadata": {"name": doomed}})
    name = unique("h100")
    await offer(admin, name, resource_name="nvidia.com/TEST")
    await order(admin, doomed, "d1", class_name=name, status={"phase": "Bound", "nodeName": "n1"})
    devices = await items(admin, device_path(doomed))
    await admin.delete(f"/api/v1/namespaces/{doomed}")
    plan = usage_plan(devices, await items(admin, class_path()), [], [])
    assert plan.put_monitors  # the pass would write there
    report = await send(admin, usage_writes(plan), Writes())
    assert (report.written, report.refused) == ((), ())
    assert await items(admin, monitor_path(doomed)) == []
    await admin.delete(class_path(name))
