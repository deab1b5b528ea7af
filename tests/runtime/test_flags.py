"""The controller's flags (R-RUN-1): values, environment, and refusals that name flag, value and rule."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cozygpu.base.durations import parse_duration
from cozygpu.runtime import command, flags
from cozygpu.runtime.flags import Address, FlagError, parse
from tests.runtime.processes import spawn

BASE = ["--namespace", "cozy-gpu"]


def test_defaults_are_the_documented_ones() -> None:
    options = parse(BASE, env={})
    assert options.enable_gpu is False
    assert options.gpu_resource_names == ()
    assert options.raw_gpu_names == "allow"
    assert options.attachment_grace == 120
    assert options.launcher_grace == 30
    assert options.bind_wait == 10
    assert options.kubeconfig is None
    assert options.health_addr == Address("0.0.0.0", 8081)
    assert options.metrics_addr == Address("0.0.0.0", 8443)
    assert options.metrics_cert_dir is None
    assert options.webhook_addr == Address("0.0.0.0", 9443)
    assert (options.lease_duration, options.renew_deadline, options.retry_period) == (15, 10, 2)
    assert options.log_format == "json"
    assert options.log_level == "info"


@pytest.mark.parametrize(("text", "seconds"), [
    ("2m", 120), ("10s", 10), ("1m30s", 90), ("500ms", 0.5), ("1.5h", 5400), ("0", 0), ("-2s", -2),
    ("1h2m3s4ms", 3723.004), ("250us", 0.00025),
])
def test_durations_are_read_the_way_go_writes_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "1d", "s", "1m 30s", "ten seconds", "--1s"])
def test_what_go_would_not_read_as_a_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_every_flag_can_come_from_its_environment_variable() -> None:
    env = {
        "COZYGPU_ENABLE_GPU": "true", "COZYGPU_CERT_DIR": "/certs", "COZYGPU_BIND_WAIT": "3s",
        "COZYGPU_GPU_RESOURCE_NAMES": "nvidia.com/b, nvidia.com/a", "COZYGPU_RAW_GPU_NAMES": "forbid",
        "COZYGPU_ATTACHMENT_GRACE": "1m30s", "COZYGPU_KUBECONFIG": "/kube", "COZYGPU_NAMESPACE": "gpu",
        "COZYGPU_HEALTH_ADDR": "127.0.0.1:1", "COZYGPU_METRICS_ADDR": "[::1]:2", "COZYGPU_WEBHOOK_ADDR": ":3",
        "COZYGPU_LEASE_DURATION": "20s", "COZYGPU_RENEW_DEADLINE": "15s", "COZYGPU_RETRY_PERIOD": "5s",
        "COZYGPU_IDENTITY": "pod-0", "COZYGPU_LOG_FORMAT": "text", "COZYGPU_LOG_LEVEL": "debug",
        "COZYGPU_WEBHOOK_TIMEOUT": "20s", "COZYGPU_LAUNCHER_GRACE": "45s",
        "COZYGPU_METRICS_CERT_DIR": "/metrics-certs",
    }
    assert set(env) == {flags.env_name(flag) for flag in flags.FLAGS.flags}
    options = parse([], env=env)
    assert options.enable_gpu is True
    assert options.cert_dir == Path("/certs")
    assert options.bind_wait == 3
    assert options.webhook_timeout == 20
    assert options.gpu_resource_names == ("nvidia.com/a", "nvidia.com/b")
    assert options.raw_gpu_names == "forbid"
    assert options.attachment_grace == 90
    assert options.launcher_grace == 45
    assert options.kubeconfig == "/kube"
    assert options.namespace == "gpu"
    assert options.health_addr == Address("127.0.0.1", 1)
    assert options.metrics_addr == Address("::1", 2)
    assert options.metrics_cert_dir == Path("/metrics-certs")
    assert options.webhook_addr == Address("0.0.0.0", 3)
    assert (options.lease_duration, options.renew_deadline, options.retry_period) == (20, 15, 5)
    assert options.identity == "pod-0"
    assert (options.log_format, options.log_level) == ("text", "debug")


def test_the_command_line_wins_over_the_environment() -> None:
    options = parse([*BASE, "--bind-wait", "4s"], env={"COZYGPU_BIND_WAIT": "9s"})
    assert options.bind_wait == 4


def test_the_namespace_defaults_to_pod_namespace() -> None:
    assert parse([], env={"POD_NAMESPACE": "from-pod"}).namespace == "from-pod"


def test_a_default_identity_is_the_hostname_with_a_random_suffix() -> None:
    first, second = parse(BASE, env={}).identity, parse(BASE, env={}).identity
    assert first != second
    assert first.rsplit("_", 1)[0] == second.rsplit("_", 1)[0]


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--bind-wait", "0s"], {}, "--bind-wait=0s: must be positive"),
    ([], {"COZYGPU_BIND_WAIT": "0"}, "--bind-wait=0: must be positive"),
    (["--attachment-grace", "-1m"], {}, "--attachment-grace=-1m: must be positive"),
    (["--attachment-grace", "2 minutes"], {}, "--attachment-grace=2 minutes: not a duration"),
    (["--launcher-grace", "0s"], {}, "--launcher-grace=0s: must be positive"),
    (["--gpu-resource-names", "nvidia.com/a,,nvidia.com/b"], {}, "an empty entry in the comma-separated list"),
    (["--gpu-resource-names", "h100"], {}, "'h100': must be domain/name"),
    (["--gpu-resource-names", "gpu.cozystack.io/h100"], {}, "holds GPU budget keys"),
    (["--gpu-resource-names", "kubernetes.io/gpu"], {}, "native resources"),
    (["--raw-gpu-names", "maybe"], {}, "--raw-gpu-names=maybe: must be one of allow, forbid"),
    (["--log-format", "xml"], {}, "--log-format=xml: must be one of json, text"),
    (["--log-level", "loud"], {}, "--log-level=loud: must be one of debug, info, warning, error"),
    (["--enable-gpu=perhaps"], {}, "--enable-gpu=perhaps: must be true or false"),
    (["--enable-gpu"], {}, "--cert-dir: required with --enable-gpu"),
    (["--renew-deadline", "15s"], {}, "--renew-deadline=15s: must be shorter than --lease-duration (15s)"),
    (["--retry-period", "9s"], {}, "--retry-period=9s: 1.2 x --retry-period must be shorter than --renew-deadline"),
    (["--lease-duration", "15500ms"], {}, "--lease-duration=15500ms: must be a whole number of seconds"),
    (["--health-addr", "8081"], {}, "--health-addr=8081: must be HOST:PORT or :PORT"),
    (["--metrics-addr", ":99999"], {}, "the port must be at most 65535"),
    (["--namespace", "Not_A_Label"], {}, "--namespace=Not_A_Label: must be a DNS label"),
    (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
])
def test_a_bad_value_is_refused_naming_the_flag_the_value_and_the_rule(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(FlagError) as refused:
        parse([*BASE, *argv], env=env)
    assert message in str(refused.value)


def test_without_a_namespace_the_refusal_says_where_one_comes_from(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setattr(flags, "_SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    with pytest.raises(FlagError, match="--namespace: required: set it, or POD_NAMESPACE"):
        parse([], env={})


def test_the_command_exits_2_with_the_reason_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main([*BASE, "--bind-wait", "-5s"]) == 2
    assert "cozygpu controller: --bind-wait=-5s: must be positive" in capsys.readouterr().err


async def test_the_real_process_refuses_bad_flags_before_it_touches_the_cluster(tmp_path: Path) -> None:
    # The kubeconfig does not even exist: the flags are refused first.
    proc = await spawn(["--kubeconfig", str(tmp_path / "missing"), "--namespace", "x", "--raw-gpu-names", "sometimes"])
    assert proc.stderr is not None
    async with asyncio.timeout(30):
        err = (await proc.stderr.read()).decode()
        code = await proc.wait()
    assert code == 2
    assert "--raw-gpu-names=sometimes: must be one of allow, forbid" in err
    assert "Traceback" not in err


def test_the_controller_caches_the_shared_specs_with_their_indexes() -> None:
    # The binder and the webhooks will ask the cache for cozygpu.views.specs objects; the controller
    # must register exactly those (a bare spec under the same key would lack their indexes).
    from cozygpu.runtime import kinds
    from cozygpu.views import specs

    gpu = kinds.webhook_kinds(enable_gpu=True, namespace="cozy-gpu")
    assert specs.GPU_DEVICES in gpu
    assert specs.PODS in gpu
    assert specs.TENANT_QUOTAS in gpu
    assert all(spec.key != "resourcequotas.v1" for spec in gpu), "only tenant-quota objects are cached"
    by_key = {spec.key: spec for spec in gpu}
    assert by_key[specs.GPU_DEVICES.key].indexers is specs.GPU_DEVICES.indexers
    assert set(kinds.lazy_kinds(enable_gpu=True)) == {specs.VMIS, specs.KUBEVIRTS, specs.RESOURCE_SLICES,
                                                      specs.DEVICE_CLASSES, specs.RESOURCE_CLAIMS,
                                                      specs.DEVICE_TAINT_RULES}
    assert kinds.lazy_kinds(enable_gpu=False) == ()
