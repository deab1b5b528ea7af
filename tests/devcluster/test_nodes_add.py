"""``cozygpu cluster nodes add --gpus`` on the real local plane: the node's GPUs are reported by the real agent
(from a simulated sysfs tree and kubelet socket), so its units are orderable; ``nodes remove`` and
``cluster stop`` take the node, its report and its process away."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from cozygpu import keys
from cozygpu.commands.catalog import read_snapshot
from cozygpu.devcluster import nodes, simnodes
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, resource_path
from cozygpu.model.catalog import catalog
from cozygpu.views import specs
from tests.binder.support import VMI_CRD, class_path, device_path
from tests.binder.world import running_binder, seen_by
from tests.support.crds import install_fixture_crd
from tests.support.processes import gone

H100 = "nvidia.com/GH100_H100_SXM5_80GB"
GPUNODES = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)


def cozygpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cozygpu", *args], capture_output=True, text=True,
                          check=False, timeout=180)


async def cluster(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cozygpu, "cluster", *args, "--dir", str(directory))


def units(status: dict[str, Any]) -> Counter[str]:
    served: Counter[str] = Counter()
    for device in status["devices"]:
        served[device["resourceName"]] += device["allocatable"]
    return served


def listening_sockets(suffix: str) -> list[Path]:
    """Unix sockets some process listens on whose path ends with ``suffix`` (from /proc/net/unix)."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return [Path(fields[-1]) for fields in (line.split() for line in lines)
            if len(fields) == 8 and fields[-1].endswith(suffix)]


async def test_a_node_added_with_gpus_is_reported_by_the_real_agent_its_units_bind_and_remove_takes_it_all(
    full_plane: ControlPlane, full_admin: Client,
) -> None:
    directory, tag = full_plane.directory, uuid.uuid4().hex[:6]
    name, probe = f"added-{tag}", f"nvidia.com/TEST_{tag}"  # a name no table knows: generic passthrough GPUs
    try:
        added = await cluster(directory, "nodes", "add", name, "--gpus", f"{H100}=2", "--gpus", f"{probe}=3",
                              "--label", f"test={tag}")
        assert added.returncode == 0, added.stderr
        assert f"{name}: 5 GPU functions, 5 allocatable" in added.stdout
        pid = int((directory / "nodes" / f"{name}.pid").read_text())
        assert not gone(pid)
        [kubelet_socket] = listening_sockets(f"/{name}.sock")

        # The report the real agent wrote from the node's sysfs tree and kubelet.
        status = (await full_admin.get(f"{GPUNODES}/{name}"))["status"]
        assert units(status) == {H100: 2, probe: 3}
        assert status["resourceNames"] == sorted([H100, probe])
        assert status["agent"]["problems"] == []
        assert {(d["kind"], d["driver"]) for d in status["devices"]} == {("Passthrough", "vfio-pci")}
        assert {d["deviceID"] for d in status["devices"] if d["resourceName"] == H100} == {"2330"}
        node = await full_admin.get(f"{nodes.NODES}/{name}")
        assert nodes.is_ready(node)
        assert node["metadata"]["labels"]["test"] == tag
        assert {r: node["status"]["allocatable"][r] for r in (H100, probe)} == {H100: "2", probe: "3"}

        # Orderable: a class of that resource name shows the node's units free ...
        gpu_class, namespace = f"probe-{tag}", f"t-{tag}"
        await full_admin.create(class_path(), {
            "apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND, "metadata": {"name": gpu_class},
            "spec": {"vendor": "NVIDIA", "model": "Probe", "mode": "Passthrough", "memory": "80Gi",
                     "resourceName": probe, "source": {"devicePlugin": {}}}})
        await full_admin.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        snapshot = await read_snapshot(full_admin, hoster_names=[H100, probe])
        [entry] = [e for e in catalog(snapshot, namespace) if e.class_name == gpu_class]
        assert (entry.free_in_cluster, entry.free_on_best_node, entry.best_node, entry.orderable) == (3, 3, name, 3)

        # ... and the binder binds an order of all three onto it.
        await install_fixture_crd(full_admin, VMI_CRD)
        async with running_binder(full_admin) as binder:
            order = await full_admin.create(device_path(namespace), {
                "apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": "train"},
                "spec": {"className": gpu_class, "count": 3}})
            await seen_by(binder, specs.GPU_DEVICES.key, order)
            await binder.each_lane()
        bound = (await full_admin.get(device_path(namespace, "train")))["status"]
        assert (bound["phase"], bound["nodeName"]) == ("Bound", name)

        removed = await cluster(directory, "nodes", "remove", name)
        assert removed.returncode == 0, removed.stderr
        assert gone(pid), "nodes remove left the node's agent running"
        assert await full_admin.get_or_none(f"{nodes.NODES}/{name}") is None
        assert await full_admin.get_or_none(f"{GPUNODES}/{name}") is None
        assert not (directory / "nodes" / name).exists(), "the sysfs tree is left"
        assert not (directory / "nodes" / f"{name}.pid").exists()
        assert not kubelet_socket.exists(), "the kubelet socket is left"
        assert listening_sockets(f"/{name}.sock") == []
    finally:
        await cluster(directory, "nodes", "remove", name)


async def test_a_vgpu_node_is_reported_on_an_api_only_plane_listed_by_status_and_ended_by_stop(
    plane: ControlPlane, tmp_path: Path,
) -> None:
    # `plane` proves the binaries exist (or fails under CI); `cluster stop` needs a plane of the test's own.
    directory = tmp_path / "cluster"
    started = await cluster(directory, "start", "--api-only")
    assert started.returncode == 0, started.stderr
    pid = None
    try:
        added = await cluster(directory, "nodes", "add", "vgpu-1", "--gpus", "nvidia.com/GRID_A16-2Q=4")
        assert added.returncode == 0, added.stderr
        assert "vgpu-1: 1 GPU functions, 4 allocatable (nvidia.com/GRID_A16-2Q)" in added.stdout
        pid = int((directory / "nodes" / "vgpu-1.pid").read_text())
        async with ControlPlane.attach(directory).client() as admin:
            [device] = (await admin.get(f"{GPUNODES}/vgpu-1"))["status"]["devices"]
        assert (device["kind"], device["driver"], device["allocatable"]) == ("MdevParent", "nvidia", 4)
        assert [(t["name"], t["instances"]) for t in device["mdevTypes"]] == [("GRID A16-2Q", 4)]
        status = await cluster(directory, "status")
        assert any(line.split()[:4] == ["node", "vgpu-1", str(pid), "ok"] for line in status.stdout.splitlines()), \
            status.stdout
    finally:
        stopped = await cluster(directory, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert pid is not None
    assert gone(pid), "cozygpu cluster stop left the added node's agent running"
    assert not (directory / "nodes" / "vgpu-1").exists()
    assert simnodes.added_health(directory) == []
    assert os.listdir(directory / "nodes") == []
