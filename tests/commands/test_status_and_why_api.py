"""``cozygpu status`` and ``cozygpu why`` on states the real binder built, read through the API server."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest

from cozygpu import cli, keys
from cozygpu.commands import common, status, why
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, resource_path
from cozygpu.views import specs
from tests.binder.support import device_path
from tests.binder.world import RunningBinder, World, running_binder, seen_by, stamp
from tests.support.crds import install_fixture_crd

NAMESPACES = resource_path("", "v1", "namespaces")


@attrs.define
class Scene:
    world: World
    parent: str
    plain: str


@pytest.fixture
async def binder(admin: Client) -> AsyncIterator[RunningBinder]:
    await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
    async with running_binder(admin) as running:
        yield running


@pytest.fixture
async def scene(admin: Client, namespace: str, binder: RunningBinder) -> AsyncIterator[Scene]:
    """tenant-X (total budget 3) > tenant-X-ml (the world's namespace); n1 serves 4, n2 serves 6 but is cordoned.

    held (2, Bound on n1) and over (2, over the budget) in tenant-X-ml; big (3) in a plain namespace:
    more than the 2 units eligible nodes have free, while cordoned n2 has room.
    """
    parent = f"tenant-{uuid.uuid4().hex[:8]}"
    child = f"{parent}-ml"
    for name in (parent, child):
        await admin.create(NAMESPACES, {"metadata": {"name": name}})
    await admin.create(resource_path("", "v1", "resourcequotas", namespace=parent), {
        "metadata": {"name": keys.TENANT_QUOTA_NAME}, "spec": {"hard": {keys.QUOTA_TOTAL: "3"}}})
    world = await World.make(admin, child)
    try:
        await world.node("n1", 4)
        await world.node("n2", 6)
        await admin.merge_patch(f"/api/v1/nodes/{world.node_name('n2')}", {"spec": {"unschedulable": True}})
        await world.order("held", 2, status=world.held("n1"))
        await world.order("over", 2)
        await admin.create(device_path(namespace), {
            "apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": "big"},
            "spec": {"className": world.gpu_class, "count": 3}})
        last = await admin.get(device_path(namespace, "big"))
        await seen_by(binder, specs.GPU_DEVICES.key, last)
        await seen_by(binder, specs.NODES.key, await admin.get(f"/api/v1/nodes/{world.node_name('n2')}"))
        yield Scene(world, parent, namespace)
    finally:
        await world.cleanup()


async def read(admin: Client) -> common.Cluster:
    return await common.read_cluster(admin)


def by_name(rows: list[dict[str, Any]], name: str, namespace: str | None = None) -> dict[str, Any]:
    """The row named ``name`` (in ``namespace``, for devices: other tests leave devices of the same name)."""
    return next(row for row in rows if row["name"] == name and namespace in (None, row.get("namespace")))


async def test_status_shows_units_nodes_waiting_devices_and_whether_the_statuses_kept_up(
        admin: Client, binder: RunningBinder, scene: Scene) -> None:
    world = scene.world
    ours = {f"GPUDevice {world.namespace}/over", f"GPUDevice {scene.plain}/big", f"GPUClass {world.gpu_class}"}

    before = status.gather(await read(admin), answer_within=10)
    assert ours <= set(before["passes"]["statuses"]["behind"]), "no pass has decided on them yet"
    assert by_name(before["devices"], "over", world.namespace)["decided"] is False

    await binder.each_lane()
    report = status.gather(await read(admin), answer_within=10)

    assert not ours & set(report["passes"]["statuses"]["behind"])
    gpu_class = by_name(report["classes"], world.gpu_class)
    written = (await admin.get(resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL,
                                             name=world.gpu_class)))["status"]
    assert (gpu_class["units"], gpu_class["held"], gpu_class["free"]) == (written["units"], written["held"],
                                                                          written["free"]) == (4, 2, 2)
    n1, n2 = by_name(report["nodes"], world.node_name("n1")), by_name(report["nodes"], world.node_name("n2"))
    assert n1["eligible"] is True
    assert n1["resources"] == [{"resourceName": world.resource, "served": 4, "held": 2, "rawInUse": 0, "launching": 0,
                                "free": 2}]
    assert n1["reportFresh"] is True
    assert n1["reportAgeSeconds"] is not None
    assert (n2["eligible"], n2["reason"]) == (False, "NodeCordoned")
    over = by_name(report["devices"], "over", world.namespace)
    assert (over["phase"], over["decided"], over["reason"]) == ("Pending", True, "BudgetExceeded")
    assert over["message"] == (f"not accepted: budget {keys.QUOTA_TOTAL} of {scene.parent}: 3 allowed, 2 in use, "
                               "order of 2 exceeds it by 1")
    assert by_name(report["devices"], "big", scene.plain)["reason"] == "NoNodeWithRoom"
    assert "held" not in {row["name"] for row in report["devices"] if row["namespace"] == world.namespace}


async def test_status_names_the_leader_and_a_bind_request_placement_left_waiting(
        admin: Client, binder: RunningBinder, scene: Scene, namespace: str) -> None:
    world = scene.world
    renewed = datetime.now(UTC) - timedelta(seconds=3)
    lease = await admin.create(resource_path("coordination.k8s.io", "v1", "leases", namespace=namespace), {
        "metadata": {"name": keys.LEADER_LEASE},
        "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15, "renewTime": stamp(renewed)
                 .replace("Z", ".000000Z")}})
    asked = stamp(datetime.now(UTC) - timedelta(seconds=40))
    await admin.merge_patch(device_path(world.namespace, "held", status=True), {"status": {
        "attachment": {"vmi": "vm-a", "attachedAt": asked}, "bindRequest": {"id": "r-1", "vmi": "vm-a",
                                                                           "time": asked}}})
    cluster = attrs.evolve(await read(admin), lease=lease)

    report = status.gather(cluster, answer_within=10)

    assert report["leader"]["holder"] == "replica-a"
    assert report["leader"]["current"] is True
    lane = report["passes"]["placement"]
    assert f"{world.namespace}/held" in lane["waitingDevices"]
    assert lane["healthy"] is False
    assert lane["oldestSeconds"] >= 40

    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("held"))
    await binder.placement_pass()
    lane = status.gather(await read(admin), answer_within=10)["passes"]["placement"]
    assert f"{world.namespace}/held" not in lane["waitingDevices"]

    stale = attrs.evolve(cluster, now=renewed + timedelta(seconds=20))
    assert status.leader(stale)["current"] is False  # type: ignore[index]


async def test_why_a_device_over_budget_names_the_budget_to_raise_and_by_how_much(
        admin: Client, binder: RunningBinder, scene: Scene) -> None:
    await binder.each_lane()
    cluster = await read(admin)

    report = await why.explain_device(admin, cluster, scene.world.namespace, "over")

    assert report is not None
    assert report["bound"]["reason"] == "BudgetExceeded"
    assert [e["reason"] for e in report["events"]] == ["NotAccepted"]
    assert report["reason"] == "BudgetExceeded"
    assert report["wouldChangeIt"] == [
        f"raise budget {keys.QUOTA_TOTAL} of {scene.parent} from 3 to 4 (by 1)",
        "with that, the order would be accepted now",
    ]


async def test_why_a_device_no_eligible_node_can_take_points_at_the_node_with_room_and_what_keeps_it(
        admin: Client, binder: RunningBinder, scene: Scene) -> None:
    world = scene.world
    await binder.each_lane()

    report = await why.explain_device(admin, await read(admin), scene.plain, "big")

    assert report is not None
    assert report["reason"] == "NoNodeWithRoom"
    assert report["now"].startswith(f"not accepted: GPUDevice {scene.plain}/big: no eligible node has room"), \
        report["now"]
    assert report["wouldChangeIt"] == [
        f"node {world.node_name('n1')}: 2 of 4 {world.resource} free for this set, it needs 3; "
        "1 more would have to be freed there",
        f"node {world.node_name('n2')} has room (6 of 6 {world.resource} free for this set, it needs 3) but "
        "cordoned (spec.unschedulable)",
    ]


async def test_why_a_vmi_gives_the_binders_answers_and_what_a_start_now_would_get(
        admin: Client, binder: RunningBinder, scene: Scene) -> None:
    world = scene.world
    for name, vmi, request in (("held", "vm-a", "r-1"), ("over", "vm-b", "r-2")):
        await admin.merge_patch(device_path(world.namespace, name, status=True), {"status": {
            "attachment": {"vmi": vmi, "attachedAt": stamp()}, "bindRequest": {"id": request, "vmi": vmi,
                                                                             "time": stamp()}}})
    await seen_by(binder, specs.GPU_DEVICES.key, await world.device("over"))
    await binder.placement_pass()
    cluster = await read(admin)

    held = await why.explain_vmi(admin, cluster, world.namespace, "vm-a")
    refused = await why.explain_vmi(admin, cluster, world.namespace, "vm-b")

    assert held is not None
    assert refused is not None
    assert held["devices"][0]["bindAnswer"]["result"] == "Succeeded"
    assert held["now"] == f"a start now would be placed on node {world.node_name('n1')}"
    assert refused["devices"][0]["bindAnswer"]["reason"] == "BudgetExceeded"
    assert refused["reason"] == "BudgetExceeded"
    assert refused["wouldChangeIt"][0] == f"raise budget {keys.QUOTA_TOTAL} of {scene.parent} from 3 to 4 (by 1)"
    assert await why.explain_vmi(admin, cluster, world.namespace, "vm-nobody") is None


async def test_the_commands_answer_through_a_kubeconfig_as_a_person_runs_them(
        plane: ControlPlane, binder: RunningBinder, scene: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    await binder.each_lane()
    kubeconfig = str(plane.kubeconfig)

    code = await asyncio.to_thread(cli.main, ["status", "-o", "json", "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert code == 0
    assert by_name(json.loads(out)["devices"], "over", scene.world.namespace)["reason"] == "BudgetExceeded"

    code = await asyncio.to_thread(cli.main, ["status", "--kubeconfig", kubeconfig])
    table = capsys.readouterr().out
    assert code == 0
    assert any(line.startswith(f"{scene.world.namespace}/over ") and "BudgetExceeded" in line
               for line in table.splitlines())

    code = await asyncio.to_thread(cli.main, ["why", "gpudevice/over", "-n", scene.world.namespace,
                                              "--kubeconfig", kubeconfig])
    text = capsys.readouterr().out
    assert code == 0
    assert f"  - raise budget {keys.QUOTA_TOTAL} of {scene.parent} from 3 to 4 (by 1)" in text.splitlines()

    code = await asyncio.to_thread(cli.main, ["why", "gpudevice/none", "-n", scene.world.namespace,
                                              "--kubeconfig", kubeconfig])
    assert code == 1
    assert capsys.readouterr().err.strip() == f"cozygpu why: GPUDevice {scene.world.namespace}/none does not exist"
