"""``cozygpu usage`` and ``kubectl gpu usage`` on holds whose ledger status is written through the API server.

The holds' statuses carry ``heldSince``, ``idleSince`` and ``idleSeconds`` as
the binder writes them (through the status subresource, so the CRD's schema
keeps them); one VM runs (a VMI listing a Running launcher pod) on two of
them. With ``--since 24h`` every hold began, and every open idle period
opened, before the window: the figures do not move while the test runs, and
the two commands' JSON must be equal. Without ``--since`` they grow with the
clock, and are checked between the times read before and after the command.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest

from cozygpu import cli
from cozygpu.commands import common
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, resource_path
from tests.binder.support import VMI_CRD, VMIS, device_path
from tests.binder.world import World, stamp
from tests.commands.test_kubectl_plugin_api import BIN, PLUGIN, run
from tests.support.crds import install_fixture_crd

NAMESPACES = resource_path("", "v1", "namespaces")
HOUR = timedelta(hours=1)


@attrs.frozen(kw_only=True)
class Hold:
    namespace: str
    name: str
    gpu_class: str
    units: int
    held_for: timedelta
    #: None: a VM runs on it.
    idle_for: timedelta | None
    idle_seconds: int


@attrs.define
class Scene:
    """tenant-X (``parent``) > tenant-X-ml (``child``), and tenant-Xz (``stranger``: a name sharing the prefix)."""

    parent: str
    child: str
    stranger: str
    class_a: str
    class_b: str
    #: Every timestamp is this instant less a whole number of seconds.
    at: datetime
    holds: dict[str, Hold]


async def namespace_of(admin: Client, name: str) -> str:
    await admin.create(NAMESPACES, {"metadata": {"name": name}})
    return name


async def write_hold(admin: Client, hold: Hold, at: datetime, node: str, *, vmi: dict[str, Any] | None) -> None:
    await admin.create(device_path(hold.namespace), {
        "apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice", "metadata": {"name": hold.name},
        "spec": {"className": hold.gpu_class, "count": hold.units}})
    status: dict[str, Any] = {"phase": "Bound", "nodeName": node, "heldSince": stamp(at - hold.held_for),
                              "idleSeconds": hold.idle_seconds}
    if hold.idle_for is not None:
        status["idleSince"] = stamp(at - hold.idle_for)
    if vmi is not None:
        status["attachment"] = {"vmi": vmi["metadata"]["name"], "uid": vmi["metadata"]["uid"], "attachedAt": stamp()}
    written = await admin.merge_patch(device_path(hold.namespace, hold.name, status=True), {"status": status})
    assert written["status"]["heldSince"] == status["heldSince"], "the CRD's schema keeps the ledger"


async def running_vm(admin: Client, namespace: str, node: str) -> dict[str, Any]:
    """VMI ``vm`` whose ``status.activePods`` lists a Running launcher pod on ``node``."""
    vmis = resource_path(*VMIS, namespace=namespace)
    vm = await admin.create(vmis, {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                   "metadata": {"name": "vm"}, "spec": {"domain": {"devices": {}}}})
    pods = resource_path("", "v1", "pods", namespace=namespace)
    pod = await admin.create(pods, {"metadata": {"name": "virt-launcher-vm-abcde"}, "spec": {
        "nodeName": node, "containers": [{"name": "compute", "image": "virt-launcher"}]}})
    await admin.merge_patch(f"{pods}/virt-launcher-vm-abcde/status", {"status": {"phase": "Running"}})
    await admin.merge_patch(f"{vmis}/vm/status", {"status": {"phase": "Running", "nodeName": node,
                                                            "activePods": {pod["metadata"]["uid"]: node}}})
    return vm


@pytest.fixture
async def scene(admin: Client) -> AsyncIterator[Scene]:
    await install_fixture_crd(admin, VMI_CRD)
    parent = await namespace_of(admin, f"tenant-{uuid.uuid4().hex[:8]}")
    child = await namespace_of(admin, f"{parent}-ml")
    stranger = await namespace_of(admin, f"{parent}z")
    world_a, world_b = await World.make(admin, child), await World.make(admin, child)
    try:
        node_a, node_b = await world_a.node("n1", 8), await world_b.node("n1", 8)
        a, b = world_a.gpu_class, world_b.gpu_class
        holds = [
            Hold(namespace=child, name="train", gpu_class=a, units=2, held_for=30 * HOUR, idle_for=None,
                 idle_seconds=7200),
            Hold(namespace=child, name="long", gpu_class=a, units=1, held_for=100 * HOUR, idle_for=None,
                 idle_seconds=25 * 3600),
            Hold(namespace=child, name="spare", gpu_class=a, units=1, held_for=50 * HOUR, idle_for=40 * HOUR,
                 idle_seconds=3600),
            Hold(namespace=child, name="small", gpu_class=b, units=1, held_for=48 * HOUR, idle_for=30 * HOUR,
                 idle_seconds=0),
            Hold(namespace=parent, name="base", gpu_class=a, units=1, held_for=72 * HOUR, idle_for=36 * HOUR,
                 idle_seconds=1800),
            Hold(namespace=stranger, name="other", gpu_class=a, units=3, held_for=25 * HOUR, idle_for=25 * HOUR,
                 idle_seconds=0),
        ]
        at = datetime.now(UTC).replace(microsecond=0)
        vm = await running_vm(admin, child, node_a)
        for hold in holds:
            node = node_b if hold.gpu_class == b else node_a
            await write_hold(admin, hold, at, node, vmi=vm if hold.idle_for is None else None)
        await world_a.order("waiting", 1)  # Pending: holds nothing
        yield Scene(parent=parent, child=child, stranger=stranger, class_a=a, class_b=b, at=at,
                    holds={hold.name: hold for hold in holds})
    finally:
        await world_a.cleanup()
        await world_b.cleanup()


async def usage(plane: ControlPlane, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``cozygpu usage ARGV`` as a person runs it, through the plane's kubeconfig: its stdout."""
    code = await asyncio.to_thread(cli.main, ["usage", *argv, "--kubeconfig", str(plane.kubeconfig)])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    return out


def rows(answer: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["namespace"], row["class"]): row for row in answer["rows"]}


async def test_a_day_of_a_tenant_subtree_per_namespace_and_class_with_each_holds_figures(
        plane: ControlPlane, scene: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    answer = json.loads(await usage(plane, capsys, "-n", scene.parent, "--subtree", "--since", "24h", "-o", "json"))

    assert (answer["namespace"], answer["subtree"], answer["since"]) == (scene.parent, True, "24h")
    assert [(row["namespace"], row["class"]) for row in answer["rows"]] == sorted(
        [(scene.parent, scene.class_a), (scene.child, scene.class_a), (scene.child, scene.class_b)])
    found = rows(answer)
    child_a = found[(scene.child, scene.class_a)]
    # train: 2 units x 24 h held, its 2 h of earlier idle time counted in the window (their times are unknown);
    # long: 25 h of earlier idle time, at most the 24 h of the window; spare: idle since before the window,
    # so its earlier idle hour lies before it.
    assert {k: v for k, v in child_a.items() if k != "holds"} == {
        "namespace": scene.child, "class": scene.class_a, "unitsHeld": 4, "unitsRunning": 3, "unitsIdle": 1,
        "gpuHoursHeld": 96.0, "gpuHoursIdle": 52.0, "idleShare": round(52 / 96, 6)}
    assert [(h["name"], h["units"], h["running"], h["gpuHoursHeld"], h["gpuHoursIdle"], h["idleSince"])
            for h in child_a["holds"]] == [
        ("long", 1, True, 24.0, 24.0, None), ("spare", 1, False, 24.0, 24.0, stamp(scene.at - 40 * HOUR)),
        ("train", 2, True, 48.0, 4.0, None)]
    assert child_a["holds"][2]["heldSince"] == stamp(scene.at - 30 * HOUR)
    child_b = found[(scene.child, scene.class_b)]
    assert (child_b["unitsHeld"], child_b["unitsIdle"], child_b["gpuHoursHeld"], child_b["gpuHoursIdle"],
            child_b["idleShare"]) == (1, 1, 24.0, 24.0, 1.0)
    assert found[(scene.parent, scene.class_a)]["gpuHoursIdle"] == 24.0

    table = await usage(plane, capsys, "-n", scene.parent, "--subtree", "--since", "24h")
    assert table.rstrip("\n") == common.table(
        ["NAMESPACE", "CLASS", "HELD", "RUNNING", "IDLE", "GPU-HOURS HELD (24h)", "GPU-HOURS IDLE (24h)",
         "IDLE SHARE"],
        sorted([[scene.parent, scene.class_a, "1", "0", "1", "24.00", "24.00", "100%"],
                [scene.child, scene.class_a, "4", "3", "1", "96.00", "52.00", "54%"],
                [scene.child, scene.class_b, "1", "0", "1", "24.00", "24.00", "100%"]]))


async def test_one_namespace_alone_and_every_namespace(
        plane: ControlPlane, scene: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    alone = json.loads(await usage(plane, capsys, "-n", scene.parent, "--since", "24h", "-o", "json"))
    every = json.loads(await usage(plane, capsys, "--since", "24h", "-o", "json"))

    assert set(rows(alone)) == {(scene.parent, scene.class_a)}, "no child without --subtree"
    ours = {key for key in rows(every) if key[0] in (scene.parent, scene.child, scene.stranger)}
    assert ours == {(scene.parent, scene.class_a), (scene.child, scene.class_a), (scene.child, scene.class_b),
                    (scene.stranger, scene.class_a)}
    assert rows(every)[(scene.stranger, scene.class_a)]["gpuHoursIdle"] == 72.0
    subtree = json.loads(await usage(plane, capsys, "-n", scene.parent, "--subtree", "--since", "24h", "-o", "json"))
    assert scene.stranger not in {ns for ns, _ in rows(subtree)}, "tenant-Xz is no child of tenant-X"

    empty = await usage(plane, capsys, "-n", f"{scene.child}-none", "--subtree")
    assert empty == f"no GPUDevice holds units in {scene.child}-none or its tenant children\n"


async def test_without_a_window_each_hold_counts_since_it_began(
        plane: ControlPlane, scene: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    before = datetime.now(UTC)
    answer = json.loads(await usage(plane, capsys, "-n", scene.parent, "--subtree", "-o", "json"))
    after = datetime.now(UTC)

    assert answer["since"] is None
    holds = {hold["name"]: hold for row in answer["rows"] for hold in row["holds"]}
    assert set(holds) == {"train", "long", "spare", "small", "base"}
    for name, hold in scene.holds.items():
        if hold.namespace == scene.stranger:
            continue
        # Hours at scene.at, and how much they grew by the time the command read the clock.
        held = hold.units * hold.held_for / HOUR
        idle = hold.units * (hold.idle_seconds / 3600 + (0 if hold.idle_for is None else hold.idle_for / HOUR))
        grew = [hold.units * (t - scene.at) / HOUR for t in (before, after)]
        assert held + grew[0] - 1e-6 <= holds[name]["gpuHoursHeld"] <= held + grew[1] + 1e-6, name
        if hold.idle_for is None:
            assert holds[name]["gpuHoursIdle"] == idle, name
        else:
            assert idle + grew[0] - 1e-6 <= holds[name]["gpuHoursIdle"] <= idle + grew[1] + 1e-6, name


async def test_kubectl_gpu_usage_answers_as_cozygpu_usage_does(plane: ControlPlane, scene: Scene) -> None:
    if not PLUGIN.exists():
        pytest.fail(f"{PLUGIN} is not installed: reinstall the package (pip install -e .)", pytrace=False)
    plugin = PLUGIN
    kubectl_env = {"KUBECONFIG": str(plane.kubeconfig)}

    cozygpu = json.loads(await run(BIN / "cozygpu", "usage", "--namespace", scene.parent, "--subtree", "--since",
                                   "24h", "--output", "json", "--kubeconfig", plane.kubeconfig))
    as_json = json.loads(await run(plugin, "-n", scene.parent, "usage", "--subtree", "--since", "24h", "-o", "json",
                                   env=kubectl_env))

    assert cozygpu.pop("now") <= as_json.pop("now")
    assert as_json == cozygpu
    assert len(cozygpu["rows"]) == 3
