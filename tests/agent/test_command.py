"""``cozygpu agent`` flags: each from the command line, else ``COZYGPU_<FLAG>``, else the default."""

from __future__ import annotations

import pytest

from cozygpu.agent import command
from cozygpu.base.flags import FlagError


def parse(*argv: str, **env: str) -> command.Options:
    return command.parse(list(argv), {"NODE_NAME": "n", **env})


def test_defaults_fit_a_node() -> None:
    options = parse()

    assert (options.node, options.sysfs_root, options.podresources_socket, options.kubeconfig) == (
        "n", "/sys", "/var/lib/kubelet/pod-resources/kubelet.sock", None)
    assert (options.interval, options.report_interval, options.kubelet_timeout, options.once) == (
        15.0, 120.0, 10.0, False)
    assert (options.log_format, options.log_level) == ("text", "info")


def test_every_flag_comes_from_its_environment_variable() -> None:
    options = parse(COZYGPU_NODE="gpu-1", COZYGPU_SYSFS_ROOT="/host/sys",
                    COZYGPU_PODRESOURCES_SOCKET="/run/kubelet.sock", COZYGPU_KUBECONFIG="/etc/kubeconfig",
                    COZYGPU_INTERVAL="1m", COZYGPU_REPORT_INTERVAL="500ms", COZYGPU_KUBELET_TIMEOUT="3s",
                    COZYGPU_ONCE="true", COZYGPU_LOG_FORMAT="json", COZYGPU_LOG_LEVEL="debug")

    assert (options.node, options.sysfs_root, options.podresources_socket, options.kubeconfig) == (
        "gpu-1", "/host/sys", "/run/kubelet.sock", "/etc/kubeconfig")
    assert (options.interval, options.report_interval, options.kubelet_timeout, options.once) == (
        60.0, 0.5, 3.0, True)
    assert (options.log_format, options.log_level) == ("json", "debug")


def test_a_flag_wins_over_its_environment_variable_and_node_name_is_the_last_resort() -> None:
    assert parse().node == "n"
    assert parse(COZYGPU_NODE="from-env").node == "from-env"
    assert parse("--node", "from-flag", COZYGPU_NODE="from-env").node == "from-flag"


def test_once_alone_means_true() -> None:
    assert parse("--once").once


@pytest.mark.parametrize("text", ["0s", "-1s", "soon", "1d"])
def test_a_duration_must_be_positive_and_readable(text: str) -> None:
    with pytest.raises(FlagError, match="--interval"):
        parse("--interval", text)


def test_without_a_node_it_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("COZYGPU_NODE", raising=False)

    assert command.main(["--once"]) == 2
    assert "--node: required" in capsys.readouterr().err


def test_a_bad_duration_in_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COZYGPU_INTERVAL", "often")

    assert command.main(["--node", "n"]) == 2
    assert "--interval=often: not a duration" in capsys.readouterr().err


def test_a_bad_boolean_in_the_environment_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COZYGPU_ONCE", "maybe")

    assert command.main(["--node", "n"]) == 2
    assert "--once=maybe: must be true or false" in capsys.readouterr().err


def test_an_unknown_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["--node", "n", "--bogus"]) == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
