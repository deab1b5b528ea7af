"""The local control plane itself: the CLI lifecycle and the identities it mints."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cozygpu.devcluster import binaries
from cozygpu.devcluster import plane as plane_module
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path
from tests.support.planes import start_plane
from tests.support.processes import gone

REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def who_am_i(client: Client) -> dict[str, Any]:
    answer = await client.create(REVIEW, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    info: dict[str, Any] = answer["status"]["userInfo"]
    return info


def cozygpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cozygpu.cli", *args], capture_output=True, text=True,
                          check=False, timeout=120)


FULL = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def status_rows(output: str) -> dict[str, tuple[int, str]]:
    """``cozygpu cluster status``'s table: process -> (pid, state)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("PROCESS"))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        name, pid, state = line.split(maxsplit=2)
        rows[name] = (int(pid), state)
    return rows


def test_a_full_and_a_fast_cluster_start_side_by_side_and_stop_leaves_no_process(
    full_plane: ControlPlane, tmp_path: Path
) -> None:
    # `full_plane` proves the binaries exist (or fails under CI); this test starts two more through the CLI.
    first, second = tmp_path / "one", tmp_path / "two"
    for directory, extra in ((first, ()), (second, ("--api-only",))):
        started = cozygpu("cluster", "start", "--dir", str(directory), *extra)
        assert started.returncode == 0, started.stderr
        assert f"export KUBECONFIG={directory / 'kubeconfig'}" in started.stdout
    planes = [ControlPlane.attach(d) for d in (first, second)]
    try:
        assert planes[0].apiserver_port != planes[1].apiserver_port
        assert planes[0].etcd_port != planes[1].etcd_port
        again = cozygpu("cluster", "start", "--dir", str(first))
        assert again.returncode != 0
        assert "already holds a control plane" in again.stderr
        full_status = cozygpu("cluster", "status", "--dir", str(first))
        assert full_status.returncode == 0, full_status.stdout
        rows = status_rows(full_status.stdout)
        assert sorted(rows) == sorted(FULL)
        assert {state for _, state in rows.values()} == {"ok"}
        fast_status = cozygpu("cluster", "status", "--dir", str(second))
        assert fast_status.returncode == 0
        assert sorted(status_rows(fast_status.stdout)) == ["etcd", "kube-apiserver"]
    finally:
        for directory in (first, second):
            stopped = cozygpu("cluster", "stop", "--dir", str(directory))
            assert stopped.returncode == 0, stopped.stderr
    for pid, _ in rows.values():
        assert gone(pid), f"process {pid} outlived cozygpu cluster stop"
    assert gone(planes[1].apiserver_pid)
    assert gone(planes[1].etcd_pid)
    assert not (first / "state.json").exists()


def test_status_reports_a_dead_component_with_the_tail_of_its_log(full_plane: ControlPlane, tmp_path: Path) -> None:
    directory = tmp_path / "dies"
    assert cozygpu("cluster", "start", "--dir", str(directory)).returncode == 0
    try:
        started = ControlPlane.attach(directory)
        scheduler_pid, _ = started.components["kube-scheduler"]
        plane_module.terminate(scheduler_pid, 10)
        status = cozygpu("cluster", "status", "--dir", str(directory))
        assert status.returncode == 1
        assert status_rows(status.stdout)["kube-scheduler"] == (scheduler_pid, "not running")
        assert "kube-scheduler is not running; the end of" in status.stdout
        assert "kube-scheduler.log" in status.stdout
        with pytest.raises(plane_module.ControlPlaneError, match="kube-scheduler"):
            started.check()
    finally:
        cozygpu("cluster", "stop", "--dir", str(directory))


async def test_the_written_kubeconfig_reaches_the_server_as_an_admin(plane: ControlPlane) -> None:
    async with await Client.from_kubeconfig(str(plane.kubeconfig)) as client:
        version = await client.get("/version")
        assert version["gitVersion"] == plane.kubernetes_version
        info = await who_am_i(client)
    assert "system:masters" in info["groups"]


async def test_a_minted_identity_has_exactly_its_user_and_groups(client_for: Any) -> None:
    tenant = client_for("alice", ["tenant-foo-admin", "tenant-root-view"])
    info = await who_am_i(tenant)
    assert info["username"] == "alice"
    assert {"tenant-foo-admin", "tenant-root-view", "system:authenticated"} == set(info["groups"])


@pytest.mark.both_minors
async def test_a_pod_bound_token_carries_the_node_name_and_an_unbound_one_does_not(
    plane: ControlPlane, admin: Client, namespace: str
) -> None:
    bound = await plane.service_account_token(admin, namespace=namespace, service_account="agent",
                                              node_name="gpu-node-a")
    unbound = await plane.service_account_token(admin, namespace=namespace, service_account="agent")
    async with plane.token_client(bound) as client:
        info = await who_am_i(client)
    assert info["username"] == f"system:serviceaccount:{namespace}:agent"
    assert info["extra"]["authentication.kubernetes.io/node-name"] == ["gpu-node-a"]
    async with plane.token_client(unbound) as client:
        info = await who_am_i(client)
    assert "authentication.kubernetes.io/node-name" not in (info.get("extra") or {})


async def test_a_write_preconditioned_on_a_stale_resource_version_conflicts(admin: Client, namespace: str) -> None:
    # The API boundary's contract that every deciding write relies on (R-BIND-2).
    path = resource_path("", "v1", "configmaps", namespace=namespace)
    made = await admin.create(path, {"metadata": {"name": "c"}, "data": {"a": "1"}})
    rv = made["metadata"]["resourceVersion"]
    await admin.merge_patch(f"{path}/c", {"data": {"a": "2"}}, resource_version=rv)
    with pytest.raises(errors.Conflict):
        await admin.merge_patch(f"{path}/c", {"data": {"a": "3"}}, resource_version=rv)
    with pytest.raises(errors.Conflict):
        await admin.json_patch(f"{path}/c", [{"op": "replace", "path": "/data/a", "value": "4"}],
                               resource_version=rv)
    current = await admin.get(f"{path}/c")
    assert current["data"] == {"a": "2"}
    with pytest.raises(errors.NotFound):
        await admin.get(f"{path}/missing")
    with pytest.raises(errors.AlreadyExists):
        await admin.create(path, {"metadata": {"name": "c"}})


def test_a_cluster_restarted_in_its_directory_keeps_its_objects(plane: ControlPlane, tmp_path: Path) -> None:
    directory = tmp_path / "again"
    assert cozygpu("cluster", "start", "--dir", str(directory), "--api-only").returncode == 0
    current = binaries.KUBERNETES[binaries.DEFAULT_MINOR]
    kubectl = [str(binaries.cache_dir() / "bin" / f"kubernetes-{current}" / "kubectl"),
               "--kubeconfig", str(directory / "kubeconfig")]
    try:
        made = subprocess.run([*kubectl, "create", "namespace", "kept"], capture_output=True, text=True, check=False)
        assert made.returncode == 0, made.stderr
        assert cozygpu("cluster", "stop", "--dir", str(directory)).returncode == 0
        restarted = cozygpu("cluster", "start", "--dir", str(directory), "--api-only")
        assert restarted.returncode == 0, restarted.stderr
        # New authorities were minted; the rewritten kubeconfig works and etcd kept the namespace.
        got = subprocess.run([*kubectl, "get", "namespace", "kept", "-o", "name"], capture_output=True, text=True,
                             check=False)
        assert got.stdout.strip() == "namespace/kept", got.stderr
    finally:
        cozygpu("cluster", "stop", "--dir", str(directory))


def test_a_start_that_loses_the_race_for_a_free_port_retries_on_fresh_ports(
    plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    picks = iter([taken])  # the first port handed out is already in use by someone else
    real_free_port = plane_module.free_port
    monkeypatch.setattr(plane_module, "free_port", lambda: next(picks, None) or real_free_port())
    try:
        started = ControlPlane.start(directory=tmp_path / "race", build=False, timeout=60)
        try:
            assert taken not in (started.etcd_port, started.apiserver_port)
            assert started.alive()
        finally:
            started.stop()
    finally:
        squatter.close()


def test_stop_never_signals_a_process_that_took_over_a_recorded_pid(tmp_path: Path) -> None:
    # After a reboot or pid reuse, state.json names somebody else's process.
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        state = {"minor": "1.36", "kubernetes_version": "v1.36.5", "apiserver_port": 1, "etcd_port": 2,
                 "etcd_pid": bystander.pid, "apiserver_pid": bystander.pid, "owns_directory": False}
        (tmp_path / "state.json").write_text(json.dumps(state))
        (tmp_path / "controller.pid").write_text(str(bystander.pid))
        stopped = cozygpu("cluster", "stop", "--dir", str(tmp_path))
        assert stopped.returncode == 0, stopped.stderr
        assert bystander.poll() is None, "cozygpu cluster stop killed an unrelated process"
        assert not (tmp_path / "state.json").exists()
    finally:
        bystander.kill()
        bystander.wait()


async def test_a_restarted_api_server_serves_what_etcd_holds_on_its_port_to_the_same_identities() -> None:
    # A plane of its own: the restart ends every connection the shared plane's other users hold.
    plane = await asyncio.to_thread(start_plane)
    try:
        async with plane.client() as admin:
            namespace = "kept"
            await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": namespace}})
            configmaps = resource_path("", "v1", "configmaps", namespace=namespace)
            made = await admin.create(configmaps, {"metadata": {"name": "before"}})
            old_pid, port = plane.apiserver_pid, plane.apiserver_port
            ended = asyncio.Event()

            async def watch() -> None:
                with contextlib.suppress(errors.KubeError):
                    async for _ in admin.watch(configmaps, params={
                            "resourceVersion": made["metadata"]["resourceVersion"]}):
                        pass
                ended.set()

            watcher = asyncio.create_task(watch())
            await asyncio.to_thread(plane.restart_apiserver)
            async with asyncio.timeout(30):
                await ended.wait()  # the restart ended the open watch
            await watcher
            assert (plane.apiserver_port, plane.apiserver_pid != old_pid) == (port, True)
            assert gone(old_pid)
            plane.check()
            assert ControlPlane.attach(plane.directory).apiserver_pid == plane.apiserver_pid
            # The client made before the restart reaches it again, as the same admin, and etcd kept the object.
            assert (await admin.get(f"{configmaps}/before"))["metadata"]["uid"] == made["metadata"]["uid"]
            assert "system:masters" in (await who_am_i(admin))["groups"]
    finally:
        await asyncio.to_thread(plane.stop)
