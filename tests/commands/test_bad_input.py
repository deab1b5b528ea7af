"""Bad input to every command is one clear line on stderr and a non-zero exit, never a traceback.

Tried as a new user would: a kubeconfig that does not exist, is empty, is not
YAML, has no current context, or points at a server nobody listens on. The
people's commands (catalog, status, why) run in this process through the
``cozygpu`` entry point; the controller and the agent run as processes of
their own, as a Pod would run them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cozygpu import cli

GOOD = """\
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}"}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
users: [{{name: u, user: {{token: abc}}}}]
{current}
"""


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: nothing listens there


def write(tmp_path: Path, case: str) -> tuple[Path, str]:
    """A kubeconfig of ``case`` and the words the one line must contain."""
    path = tmp_path / f"kubeconfig-{case}"
    if case == "missing":
        return path, "no such file"
    if case == "empty":
        path.write_text("")
        return path, "the file is empty"
    if case == "malformed":
        path.write_text("apiVersion: v1\nclusters: [\n  - name: c\n")
        return path, "not valid YAML (line"
    if case == "no-current-context":
        path.write_text(GOOD.format(port=1, current=""))
        return path, "no current context is set (its contexts: x)"
    assert case == "unreachable"
    path.write_text(GOOD.format(port=closed_port(), current="current-context: x"))
    return path, "cannot reach the API server"


CASES = ("missing", "empty", "malformed", "no-current-context", "unreachable")
PEOPLE = {
    "catalog": lambda kc: ["catalog", "-n", "tenant-a", "--kubeconfig", kc],
    "status": lambda kc: ["status", "--kubeconfig", kc],
    "why-gpudevice": lambda kc: ["why", "gpudevice/d", "-n", "tenant-a", "--kubeconfig", kc],
    "why-vmi": lambda kc: ["why", "vmi/vm", "-n", "tenant-a", "--kubeconfig", kc],
}


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", sorted(PEOPLE))
def test_a_command_for_people_says_what_is_wrong_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, case: str) -> None:
    path, says = write(tmp_path, case)
    code = cli.main(PEOPLE[command](str(path)))
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    line = one_line(err)
    assert line.startswith(f"cozygpu {command.split('-')[0]}: "), line
    assert says in line, line
    if case != "unreachable":
        assert str(path) in line, "the line names the file it read"


def test_without_kubeconfig_the_default_file_is_named_with_how_to_choose_another(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.main(["status"]) == 1
    line = one_line(capsys.readouterr().err)
    assert f"kubeconfig {tmp_path}/.kube/config (the default; pass --kubeconfig or set KUBECONFIG): no such file" \
        in line


def test_a_context_that_does_not_exist_is_named_with_the_ones_that_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(GOOD.format(port=1, current="current-context: x"))
    assert cli.main(["catalog", "-n", "t", "--kubeconfig", str(path), "--context", "prod"]) == 1
    assert "context prod does not exist (its contexts: x)" in one_line(capsys.readouterr().err)


def test_kubeconfig_lists_skip_missing_files_and_name_them_all_when_none_exists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/a:{tmp_path}/b")
    assert cli.main(["status"]) == 1
    line = one_line(capsys.readouterr().err)
    assert f"kubeconfig {tmp_path}/a, {tmp_path}/b (from $KUBECONFIG): none of these files exists" in line


@pytest.mark.parametrize("target", ["pod/x", "gpudevice", "gpudevice/a/b"])
def test_why_refuses_a_target_it_cannot_explain_before_reading_anything(
        capsys: pytest.CaptureFixture[str], target: str) -> None:
    assert cli.main(["why", target, "-n", "t", "--kubeconfig", "/nonexistent"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "gpudevice/NAME or vmi/NAME" in line or "the kind is gpudevice or vmi" in line


DAEMONS: dict[str, Callable[[str], list[str]]] = {
    "controller": lambda kc: ["controller", "--namespace", "cozy-gpu", "--kubeconfig", kc,
                              "--health-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"],
    "agent": lambda kc: ["agent", "--node", "n1", "--kubeconfig", kc],
}


@pytest.mark.parametrize("case", [c for c in CASES if c != "unreachable"])
@pytest.mark.parametrize("command", sorted(DAEMONS))
def test_the_controller_and_the_agent_end_on_a_bad_kubeconfig_with_one_line(
        tmp_path: Path, command: str, case: str) -> None:
    path, says = write(tmp_path, case)
    done = subprocess.run([sys.executable, "-m", "cozygpu", *DAEMONS[command](str(path))],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    line = one_line(done.stderr)
    assert says in line, line
    assert str(path) in line


def test_the_agent_once_against_an_unreachable_server_ends_with_one_line(tmp_path: Path) -> None:
    path, _ = write(tmp_path, "unreachable")
    done = subprocess.run([sys.executable, "-m", "cozygpu", *DAEMONS["agent"](str(path)), "--once"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert "Connect call failed" in one_line(done.stderr)


def test_cluster_commands_without_a_plane_and_unknown_commands_say_so_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cluster", "status", "--dir", str(tmp_path / "none")]) == 1
    assert f"no control plane recorded in {tmp_path / 'none'}" in one_line(capsys.readouterr().err)
    assert cli.main(["cluster", "nodes", "remove", "n1", "--dir", str(tmp_path / "none")]) == 1
    assert "no control plane recorded" in one_line(capsys.readouterr().err)
    assert cli.main(["stauts"]) == 2
    assert capsys.readouterr().err.startswith("cozygpu: unknown command 'stauts'")
