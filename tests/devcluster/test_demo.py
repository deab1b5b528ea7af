"""The main job end to end: a local control plane, the demo, the catalog command, and a clean stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cozygpu.devcluster.plane import ControlPlane
from tests.support.processes import gone


def cozygpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cozygpu", *args], capture_output=True, text=True,
                          check=False, timeout=180)


def test_the_demo_runs_the_agent_and_the_controller_and_the_catalog_explains_refusals(
    full_plane: ControlPlane, tmp_path: Path
) -> None:
    # `full_plane` proves the binaries exist (or fails under CI); the demo gets a full plane of its own.
    directory = tmp_path / "cluster"
    assert cozygpu("cluster", "start", "--dir", str(directory)).returncode == 0
    try:
        demo = cozygpu("cluster", "demo", "--dir", str(directory))
        assert demo.returncode == 0, demo.stderr
        assert "gpu-1: 2 GPU functions, 2 allocatable" in demo.stdout
        assert "gpu-2: 2 GPU functions, 5 allocatable" in demo.stdout
        published = json.loads(demo.stdout.split("cozy-gpu/cozygpu-settings: ", 1)[1].splitlines()[0])
        assert published["gpuEnabled"] == "true"
        assert json.loads(published["resourceNames"]) == [
            "nvidia.com/GH100_H100_SXM5_80GB", "nvidia.com/GRID_T4-1Q", "nvidia.com/GRID_T4-2Q"]
        controller_pid = int((directory / "controller.pid").read_text())
        os.kill(controller_pid, 0)  # still running after the demo returned
        demo_plane = ControlPlane.attach(directory)
        assert sorted(demo_plane.components) == ["kube-controller-manager", "kube-scheduler", "kwok"]

        answer = cozygpu("catalog", "-n", "tenant-acme-ml", "--count", "2", "-o", "json",
                         "--kubeconfig", str(directory / "kubeconfig"))
        assert answer.returncode == 0, answer.stderr
        by_class = {row["class"]: row for row in json.loads(answer.stdout)["classes"]}
        # The parent's budget caps the child's order (R-MOD-2), with the numbers.
        assert by_class["h100"]["reason"] == "BudgetExceeded"
        assert "gpu.cozystack.io/h100 of tenant-acme: 1 allowed, 0 in use" in by_class["h100"]["message"]
        assert by_class["h100"]["freeInCluster"] == 2
        # A VGPU class defaults to one GPU per device (R-MOD-11).
        assert by_class["t4-1q"]["reason"] == "MaxCountExceeded"
        beta = json.loads(cozygpu("catalog", "-n", "tenant-beta", "-o", "json",
                                  "--kubeconfig", str(directory / "kubeconfig")).stdout)
        assert {row["class"]: row["reason"] for row in beta["classes"]} == {"h100": None, "t4-1q": "NotEntitled"}
    finally:
        stopped = cozygpu("cluster", "stop", "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stderr
    assert gone(controller_pid), "cozygpu cluster stop left the controller running"
    for name, (pid, _) in demo_plane.components.items():
        assert gone(pid), f"cozygpu cluster stop left {name} running"


def test_the_demo_refuses_an_api_only_plane_with_a_clear_line(plane: ControlPlane, tmp_path: Path) -> None:
    directory = tmp_path / "fast"
    assert cozygpu("cluster", "start", "--api-only", "--dir", str(directory)).returncode == 0
    try:
        demo = cozygpu("cluster", "demo", "--dir", str(directory))
        assert demo.returncode == 1
        assert "the demo needs the full plane" in demo.stderr
        assert "Traceback" not in demo.stderr
    finally:
        cozygpu("cluster", "stop", "--dir", str(directory))
