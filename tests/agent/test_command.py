"""``cozygpu agent`` flags: each from the command line, else ``COZYGPU_<FLAG>``, else the default."""

from __future__ import annotations

import argparse

import pytest

from cozygpu.agent import command


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NODE_NAME", "COZYGPU_NODE", "COZYGPU_SYSFS_ROOT", "COZYGPU_PODRESOURCES_SOCKET",
                 "COZYGPU_KUBECONFIG", "COZYGPU_INTERVAL", "COZYGPU_REPORT_INTERVAL", "COZYGPU_ONCE"):
        monkeypatch.delenv(name, raising=False)


def parse(*argv: str) -> argparse.Namespace:
    return command.parser().parse_args(list(argv))


def test_defaults_fit_a_node() -> None:
    args = parse()

    assert (args.node, args.sysfs_root, args.podresources_socket, args.kubeconfig) == (
        "", "/sys", "/var/lib/kubelet/pod-resources/kubelet.sock", None)
    assert (args.interval, args.report_interval, args.once) == (15.0, 120.0, False)


def test_every_flag_comes_from_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COZYGPU_NODE", "gpu-1")
    monkeypatch.setenv("COZYGPU_SYSFS_ROOT", "/host/sys")
    monkeypatch.setenv("COZYGPU_PODRESOURCES_SOCKET", "/run/kubelet.sock")
    monkeypatch.setenv("COZYGPU_KUBECONFIG", "/etc/kubeconfig")
    monkeypatch.setenv("COZYGPU_INTERVAL", "1m")
    monkeypatch.setenv("COZYGPU_REPORT_INTERVAL", "500ms")
    monkeypatch.setenv("COZYGPU_ONCE", "true")

    args = parse()

    assert (args.node, args.sysfs_root, args.podresources_socket, args.kubeconfig) == (
        "gpu-1", "/host/sys", "/run/kubelet.sock", "/etc/kubeconfig")
    assert (args.interval, args.report_interval, args.once) == (60.0, 0.5, True)


def test_a_flag_wins_over_its_environment_variable_and_node_name_is_the_last_resort(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    assert parse().node == "from-downward-api"
    monkeypatch.setenv("COZYGPU_NODE", "from-env")
    assert parse().node == "from-env"
    assert parse("--node", "from-flag").node == "from-flag"


@pytest.mark.parametrize("text", ["0s", "-1s", "soon", "1d"])
def test_a_duration_must_be_positive_and_readable(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        command.duration(text)


def test_without_a_node_it_refuses_to_start(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["--once"]) == 2
    assert "--node is required" in capsys.readouterr().err


def test_a_bad_duration_in_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COZYGPU_INTERVAL", "often")

    assert command.main(["--node", "n"]) == 2
    assert "not a duration: 'often'" in capsys.readouterr().err


def test_a_bad_boolean_in_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COZYGPU_ONCE", "maybe")

    assert command.main(["--node", "n"]) == 2
    assert "COZYGPU_ONCE='maybe' is not a boolean" in capsys.readouterr().err
