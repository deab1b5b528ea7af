"""The controller's flags (R-RUN-1), read from the command line and ``COZYGPU_<FLAG>``.

Contract:
- ``parse(argv, env)`` reads and validates everything before the process
  touches the network. A bad value raises ``FlagError`` naming the flag, the
  value and the rule it broke; the command prints it and exits 2.
- A flag on the command line wins over its environment variable, which wins
  over the default. The variable of ``--bind-wait`` is ``COZYGPU_BIND_WAIT``.
- Durations are written the way Go writes them (``2m``, ``10s``, ``1m30s``,
  ``500ms``), since the chart and the other Cozystack controllers do.
- ``--metrics-addr`` is the HTTPS ``/metrics`` server and ``--health-addr``
  the plain probes: two servers, so they cannot share a port (port 0 takes a
  free one for each).
- Leader election needs lease duration > renew deadline > 1.2 x retry period
  (1.2 is client-go's jitter factor); the lease duration is a whole number of
  seconds because the Lease stores whole seconds.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import attrs

from cozygpu import keys
from cozygpu.admission.webhooks import WRITE_ROOM
from cozygpu.base.backoff import JITTER_FACTOR
from cozygpu.base.durations import format_duration
from cozygpu.base.flags import (
    ENV_PREFIX,
    Flag,
    FlagError,
    FlagSet,
    choice,
    env_name,
    parse_bool,
    parse_positive_duration,
)

__all__ = ["ENV_PREFIX", "JITTER_FACTOR", "Address", "FlagError", "Options", "env_name", "parse"]
#: Where a pod finds its own namespace when POD_NAMESPACE is not set.
_SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

LOG_FORMATS: Final = ("json", "text")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
RAW_NAMES: Final = (keys.RAW_NAMES_ALLOW, keys.RAW_NAMES_FORBID)
#: The API server's limit on a webhook's timeoutSeconds.
MAX_WEBHOOK_TIMEOUT: Final = 30


@attrs.frozen
class Address:
    """A listen address; port 0 asks the kernel for a free port."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@attrs.frozen(kw_only=True)
class Options:
    """The validated flags of one controller process."""

    enable_gpu: bool
    gpu_resource_names: tuple[str, ...]
    raw_gpu_names: str
    attachment_grace: float
    launcher_grace: float
    bind_wait: float
    webhook_timeout: int
    kubeconfig: str | None
    namespace: str
    health_addr: Address
    metrics_addr: Address
    metrics_cert_dir: Path | None
    webhook_addr: Address
    cert_dir: Path | None
    lease_duration: float
    renew_deadline: float
    retry_period: float
    identity: str
    log_format: str
    log_level: str


# -- values ---------------------------------------------------------------------------------

_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME_PART: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def extended_resource_name_problem(name: str) -> str | None:
    """Why ``name`` is not a usable GPU extended resource name, or None.

    Kubernetes' rule: a qualified name ``domain/name`` outside the
    ``kubernetes.io`` domains; ours (SPEC 1.1): not in the ``gpu.cozystack.io``
    domain, where it would read as a budget key.
    """
    domain, slash, base = name.partition("/")
    if not slash:
        return "must be domain/name (an extended resource name)"
    if len(domain) > 253 or not _DNS_SUBDOMAIN.fullmatch(domain):
        return f"domain {domain!r} is not a DNS subdomain"
    if len(base) > 63 or not _QUALIFIED_NAME_PART.fullmatch(base):
        return f"name {base!r} is not a qualified name part (alphanumerics, '-', '_', '.'; at most 63)"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return "the kubernetes.io domains hold native resources, not extended ones"
    if domain == keys.GROUP:
        return f"the {keys.GROUP} domain holds GPU budget keys"
    return None


def _parse_names(flag: str, raw: str) -> tuple[str, ...]:
    if not raw.strip():
        return ()
    names: list[str] = []
    for item in raw.split(","):
        name = item.strip()
        if not name:
            raise FlagError(flag, raw, "an empty entry in the comma-separated list")
        problem = extended_resource_name_problem(name)
        if problem is not None:
            raise FlagError(flag, raw, f"{name!r}: {problem}")
        if name not in names:
            names.append(name)
    return tuple(sorted(names))


def _parse_address(flag: str, raw: str) -> Address:
    host, colon, port_text = raw.rpartition(":")
    if not colon or not port_text.isdigit():
        raise FlagError(flag, raw, "must be HOST:PORT or :PORT")
    port = int(port_text)
    if port > 65535:
        raise FlagError(flag, raw, "the port must be at most 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise FlagError(flag, raw, "write an IPv6 host in brackets, like [::1]:8080")
    return Address(host or "0.0.0.0", port)


def default_identity() -> str:
    """Hostname plus a random suffix, so two processes on one host never share an identity."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:10]}"


def _default_namespace(env: Mapping[str, str]) -> str | None:
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


# -- the parser -----------------------------------------------------------------------------

FLAGS: Final = FlagSet(
    "cozygpu controller",
    "The cozygpu controller. Every flag can also come from COZYGPU_<FLAG> (for example COZYGPU_BIND_WAIT=10s).",
    [
        Flag("--enable-gpu", None, "false",
             "add placement, the KubeVirt watches and the webhooks; without it the "
             "always-on reconcilers still run"),
        Flag("--gpu-resource-names", "A,B", "", "the hoster's GPU extended resource names, comma-separated"),
        Flag("--raw-gpu-names", "allow|forbid", keys.RAW_NAMES_ALLOW,
             "whether a VM or pod may request a GPU resource name directly"),
        Flag("--attachment-grace", "DURATION", "2m", "how long an attachment waits for its VMI to appear"),
        Flag("--launcher-grace", "DURATION", "30s",
             "how long a pod that claims to be a VMI's launcher may go unlisted in the VMI's activePods "
             "before its GPUs can move or lose a hold on its node"),
        Flag("--bind-wait", "DURATION", "10s", "how long the VMI webhook waits for the binder's answer"),
        Flag("--webhook-timeout", "DURATION", "15s",
             "the webhooks' timeoutSeconds (whole seconds, at most 30); --bind-wait must leave "
             f"{WRITE_ROOM:g}s under it"),
        Flag("--kubeconfig", "PATH", None, "kubeconfig file; in-cluster configuration when unset"),
        Flag("--namespace", "NS", None, "the controller's own namespace (default: POD_NAMESPACE)"),
        Flag("--health-addr", "ADDR", ":8081", "address of /healthz and /readyz"),
        Flag("--metrics-addr", "ADDR", ":8443",
             "address of the HTTPS /metrics (a caller needs a bearer token allowed get on /metrics)"),
        Flag("--metrics-cert-dir", "DIR", None,
             "directory holding tls.crt and tls.key of the metrics server (default: a self-signed certificate "
             "made at start)"),
        Flag("--webhook-addr", "ADDR", ":9443", "address of the admission webhook server (with --enable-gpu)"),
        Flag("--cert-dir", "DIR", None, "directory holding tls.crt and tls.key of the webhook server"),
        Flag("--lease-duration", "DURATION", "15s", "how long a leader's lease is valid for the others"),
        Flag("--renew-deadline", "DURATION", "10s",
             "how long the leader keeps retrying a renewal before it stops leading"),
        Flag("--retry-period", "DURATION", "2s", "how often candidates try to acquire and the leader renews"),
        Flag("--identity", "ID", None, "this replica's name in the Lease (default: hostname and a random suffix)"),
        Flag("--log-format", "json|text", "json", "log line format"),
        Flag("--log-level", "debug|info|warning|error", "info", "least severe level logged"),
    ],
)


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Options:
    """Validated options from ``argv`` and ``env`` (``os.environ`` when None)."""
    environ = os.environ if env is None else env
    values = FLAGS.read(argv, environ)
    raw, required = values.raw, values.required

    lease = parse_positive_duration("--lease-duration", required("--lease-duration"))
    renew = parse_positive_duration("--renew-deadline", required("--renew-deadline"))
    retry = parse_positive_duration("--retry-period", required("--retry-period"))
    if lease != int(lease):
        raise FlagError("--lease-duration", required("--lease-duration"),
                        "must be a whole number of seconds (the Lease stores whole seconds)")
    if not lease > renew:
        raise FlagError("--renew-deadline", required("--renew-deadline"),
                        f"must be shorter than --lease-duration ({format_duration(lease)})")
    if not renew > JITTER_FACTOR * retry:
        raise FlagError("--retry-period", required("--retry-period"),
                        f"{JITTER_FACTOR} x --retry-period must be shorter than --renew-deadline "
                        f"({format_duration(renew)})")

    namespace = raw("--namespace") or _default_namespace(environ)
    if not namespace:
        raise FlagError("--namespace", None, "required: set it, or POD_NAMESPACE")
    if len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
        raise FlagError("--namespace", namespace, "must be a DNS label")

    cert_dir_text = raw("--cert-dir")
    enable_gpu = parse_bool("--enable-gpu", required("--enable-gpu"))
    if enable_gpu and not cert_dir_text:
        raise FlagError("--cert-dir", None, "required with --enable-gpu (the webhook server's certificate)")

    bind_wait = parse_positive_duration("--bind-wait", required("--bind-wait"))
    webhook_timeout = parse_positive_duration("--webhook-timeout", required("--webhook-timeout"))
    if webhook_timeout != int(webhook_timeout) or webhook_timeout > MAX_WEBHOOK_TIMEOUT:
        raise FlagError("--webhook-timeout", required("--webhook-timeout"),
                        f"must be whole seconds, at most {MAX_WEBHOOK_TIMEOUT}s (the API server's limit)")
    if bind_wait + WRITE_ROOM > webhook_timeout:
        # A wait the API server cuts short fails the start (fail closed) with the writes left for the binder
        # to clear after the attachment grace; the webhook must answer, and undo, before that.
        raise FlagError("--bind-wait", required("--bind-wait"),
                        f"must leave {WRITE_ROOM:g}s under --webhook-timeout ({format_duration(webhook_timeout)}) "
                        "for the checks, the writes and their undo")

    health_addr = _parse_address("--health-addr", required("--health-addr"))
    metrics_addr = _parse_address("--metrics-addr", required("--metrics-addr"))
    if metrics_addr == health_addr and metrics_addr.port != 0:
        raise FlagError("--metrics-addr", required("--metrics-addr"),
                        "must differ from --health-addr: /metrics is served over HTTPS, the probes over plain HTTP")
    metrics_cert_dir = raw("--metrics-cert-dir")

    identity = raw("--identity") or default_identity()
    if len(identity) > 253:
        raise FlagError("--identity", identity, "at most 253 characters")

    return Options(
        enable_gpu=enable_gpu,
        gpu_resource_names=_parse_names("--gpu-resource-names", required("--gpu-resource-names")),
        raw_gpu_names=choice("--raw-gpu-names", required("--raw-gpu-names"), RAW_NAMES),
        attachment_grace=parse_positive_duration("--attachment-grace", required("--attachment-grace")),
        launcher_grace=parse_positive_duration("--launcher-grace", required("--launcher-grace")),
        bind_wait=bind_wait,
        webhook_timeout=int(webhook_timeout),
        kubeconfig=raw("--kubeconfig") or None,
        namespace=namespace,
        health_addr=health_addr,
        metrics_addr=metrics_addr,
        metrics_cert_dir=Path(metrics_cert_dir) if metrics_cert_dir else None,
        webhook_addr=_parse_address("--webhook-addr", required("--webhook-addr")),
        cert_dir=Path(cert_dir_text) if cert_dir_text else None,
        lease_duration=lease,
        renew_deadline=renew,
        retry_period=retry,
        identity=identity,
        log_format=choice("--log-format", required("--log-format"), LOG_FORMATS),
        log_level=choice("--log-level", required("--log-level"), LOG_LEVELS),
    )
