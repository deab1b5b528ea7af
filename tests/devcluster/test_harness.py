"""The harness's promise to CI: a missing control plane fails under CI=true and only skips elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NEEDS_PLANE = "tests/devcluster/test_plane.py::test_a_minted_identity_has_exactly_its_user_and_groups"
ROOT = Path(__file__).resolve().parents[2]


def run_without_binaries(tmp_path: Path, *, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["COZYGPU_CACHE"] = str(tmp_path / "empty-cache")  # no binaries there
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", NEEDS_PLANE],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=120)


def test_under_ci_a_missing_control_plane_fails_the_test(tmp_path: Path) -> None:
    result = run_without_binaries(tmp_path, ci="true")
    assert result.returncode == 1, result.stdout
    assert "1 error" in result.stdout  # the fixture fails, so the test errors: never a pass, never a skip
    assert "the control plane is required under CI=true" in result.stdout


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_a_missing_control_plane_skips_with_the_build_command(tmp_path: Path, ci: str | None) -> None:
    result = run_without_binaries(tmp_path, ci=ci)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
    assert "python -m cozygpu.devcluster.binaries" in result.stdout
