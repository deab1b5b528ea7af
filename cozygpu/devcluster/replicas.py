"""The local plane's controller replicas, run as a Deployment's pods behind their Service.

``python -m cozygpu.devcluster.replicas --dir DIR`` (a background process of
the demo, pid in ``DIR/replicas.pid``) reads ``DIR/replicas.spec.json``
(written by ``write_spec``) and runs, until SIGTERM:

- **the supervisor** (kubelet's part): each replica is a child process (its
  pid in ``DIR/<name>.pid``, its output appended to ``DIR/logs/<name>.log``).
  A replica that ends, whatever its exit code (a lost term ends a replica on
  purpose, a crash, a SIGKILL), is started again with the same arguments
  after a backoff that doubles from ``BACKOFF_START`` to ``BACKOFF_MAX`` and
  starts over once a replica has run ``BACKOFF_RESET`` (kubelet's
  CrashLoopBackOff: 10 s to 5 min, reset after 10 min). A liveness probe as
  the chart's (``/healthz`` every 10 s, three failures in a row, counted once
  the replica has answered it: a starting replica is not ended) ends a
  replica that stops answering (SIGTERM, SIGKILL after the 30 s grace) so
  that it is started again;
- **the balancer** (kube-proxy's part, ``cozygpu.devcluster.balancer``): one
  loopback address in front of every replica's webhook server, which routes
  each connection to a replica that passes its readiness probe. The
  webhooks are registered at its URL;
- **metrics** as the chart's pods serve them: each replica's ``/metrics`` is
  HTTPS on a loopback port of its own (the spec's ``metrics``, else one the
  supervisor picks once), with a serving certificate the supervisor issues
  from the plane's serving CA for ``127.0.0.1`` (``DIR/replicas-metrics-tls``),
  and answers only a bearer token the API server allows ``get`` on
  ``/metrics``. The supervisor appends ``--metrics-addr`` and
  ``--metrics-cert-dir`` to each replica's command line (the last occurrence
  of a flag wins). ``prometheus_token`` mints a token that may scrape them;
  ``metrics_targets`` reads where and how (``MetricsTarget``).

``DIR/replicas.state.json`` holds, after every change, the balancer's state
(its address, the endpoints, each change with its ``time.monotonic()``) and
each replica's pid, starts, last exit and metrics target. On SIGTERM the
supervisor stops restarting, sends SIGTERM to every replica, waits up to the
grace period, then SIGKILLs what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from cozygpu.base.logging import get_logger
from cozygpu.devcluster import apply, background, chart, pki
from cozygpu.devcluster.balancer import Backend, Balancer, probe
from cozygpu.devcluster.plane import ControlPlane, ControlPlaneError, free_port
from cozygpu.kube import Client, errors, resource_path, reviews

log = get_logger("cozygpu.devcluster.replicas")

PROGRAM: Final = "cozygpu.devcluster.replicas"
SPEC_FILE: Final = "replicas.spec.json"
STATE_FILE: Final = "replicas.state.json"

BACKOFF_START: Final = 1.0
BACKOFF_MAX: Final = 30.0
BACKOFF_RESET: Final = 60.0
#: The chart's livenessProbe: /healthz every 10 s, ended after 3 failures in a row; 30 s termination grace.
LIVENESS_PERIOD: Final = 10.0
LIVENESS_TIMEOUT: Final = 1.0
LIVENESS_FAILURES: Final = 3
GRACE: Final = 30.0

#: Where the supervisor puts the replicas' metrics serving certificate (tls.crt, tls.key).
METRICS_TLS_DIR: Final = "replicas-metrics-tls"
METRICS_PATH: Final = "/metrics"
#: The chart's ClusterRole that grants get on /metrics, and its binding to the scrapers of the values.
METRICS_READER: Final = "cozygpu-metrics-reader"
#: The local plane's Prometheus: a service account the chart's metrics-reader ClusterRole is bound to.
PROMETHEUS_NAMESPACE: Final = "cozy-monitoring"
PROMETHEUS_ACCOUNT: Final = "prometheus"
#: How long a minted Prometheus token is valid (a day: a demo session; mint again after).
PROMETHEUS_TOKEN_SECONDS: Final = 24 * 3600
#: How many times (0.1 s apart) the authorizer is asked whether it sees a new binding.
RBAC_WAIT_ATTEMPTS: Final = 300


@attrs.frozen
class ReplicaSpec:
    """One replica: its command line and the loopback ports it serves on (the same on every start)."""

    name: str
    argv: tuple[str, ...]
    health: int
    webhook: int
    host: str = "127.0.0.1"
    #: The HTTPS /metrics port (0: the supervisor picks one when it starts, the same for every start).
    metrics: int = 0

    @property
    def ready_url(self) -> str:
        return f"http://{self.host}:{self.health}/readyz"

    @property
    def live_url(self) -> str:
        return f"http://{self.host}:{self.health}/healthz"


@attrs.frozen
class Spec:
    """What the supervisor runs: the balancer's address and the replicas behind it."""

    host: str
    port: int
    replicas: tuple[ReplicaSpec, ...]

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Spec:
        data = json.loads(text)
        replicas = tuple(ReplicaSpec(**{**r, "argv": tuple(r["argv"])}) for r in data["replicas"])
        return cls(host=data["host"], port=int(data["port"]), replicas=replicas)


def write_spec(directory: Path, spec: Spec) -> None:
    (directory / SPEC_FILE).write_text(spec.to_json())


@attrs.frozen(kw_only=True)
class MetricsTarget:
    """How one replica serves ``/metrics``: what a scraper (Prometheus) needs besides a token."""

    replica: str
    scheme: str
    host: str
    port: int
    path: str
    #: The CA that signed the serving certificate (PEM file), or None: self-signed, skip verification.
    ca_file: str | None
    #: The name the certificate is valid for (an IP SAN: the host itself).
    server_name: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}{self.path}"

    @property
    def insecure_skip_verify(self) -> bool:
        return self.ca_file is None

    def to_json(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "host": self.host, "port": self.port, "path": self.path,
                "caFile": self.ca_file, "serverName": self.server_name,
                "insecureSkipVerify": self.insecure_skip_verify}

    @classmethod
    def from_json(cls, replica: str, data: dict[str, Any]) -> MetricsTarget:
        return cls(replica=replica, scheme=str(data["scheme"]), host=str(data["host"]), port=int(data["port"]),
                   path=str(data["path"]), ca_file=data.get("caFile"), server_name=str(data["serverName"]))


def metrics_targets(directory: Path) -> list[MetricsTarget]:
    """Every replica's metrics target, as the supervisor last recorded them (empty before it first has)."""
    state = read_state(directory)
    if state is None:
        return []
    return [MetricsTarget.from_json(r["name"], r["metrics"]) for r in state["replicas"] if r.get("metrics")]


def read_state(directory: Path) -> dict[str, Any] | None:
    """What the supervisor last wrote (None before it first has)."""
    try:
        state: dict[str, Any] = json.loads((directory / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return state


@attrs.define(eq=False)
class _Replica:
    spec: ReplicaSpec
    metrics: MetricsTarget
    #: The spec's command line and the supervisor's metrics flags after it.
    argv: tuple[str, ...]
    pid: int | None = None
    starts: int = 0
    started: float = 0.0
    last_exit: int | None = None
    proc: asyncio.subprocess.Process | None = None


class Supervisor:
    """Runs every replica and the balancer in front of them (see the module docstring)."""

    def __init__(self, directory: Path, spec: Spec, *, metrics_tls: MetricsTls | None = None) -> None:
        """``metrics_tls``: the replicas' metrics serving certificate; None: each makes a self-signed one."""
        self.directory = directory
        self.spec = spec
        self._replicas = [self._replica(r, metrics_tls) for r in spec.replicas]
        self._stopping = False
        self.balancer = Balancer([Backend(r.name, r.host, r.webhook, r.ready_url) for r in spec.replicas],
                                 host=spec.host, port=spec.port, on_change=lambda _: self._write_state())

    async def run(self, stop: asyncio.Event) -> None:
        async with self.balancer.running(), asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._keep(replica), name=f"supervise {replica.spec.name}")
                     for replica in self._replicas]
            await stop.wait()
            self._stopping = True
            log.info("stopping the replicas")
            await asyncio.gather(*(self._end(r, GRACE) for r in self._replicas))
            for task in tasks:
                task.cancel()

    @staticmethod
    def _replica(spec: ReplicaSpec, tls: MetricsTls | None) -> _Replica:
        target = MetricsTarget(replica=spec.name, scheme="https", host=spec.host, port=spec.metrics or free_port(),
                               path=METRICS_PATH, ca_file=str(tls.ca_file) if tls is not None else None,
                               server_name=spec.host)
        argv = (*spec.argv, "--metrics-addr", target.address,
                *(("--metrics-cert-dir", str(tls.cert_dir)) if tls is not None else ()))
        return _Replica(spec, target, argv)

    def _write_state(self) -> None:
        state = {"supervisor": os.getpid(), "balancer": self.balancer.state(),
                 "replicas": [{"name": r.spec.name, "pid": r.pid, "starts": r.starts, "started": r.started,
                               "lastExit": r.last_exit, "metrics": r.metrics.to_json()} for r in self._replicas]}
        path = self.directory / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, path)

    async def _keep(self, replica: _Replica) -> None:
        """Start the replica, and again each time it ends, with kubelet's backoff."""
        delay = BACKOFF_START
        while not self._stopping:
            code, ran = await self._run_once(replica)
            if self._stopping:
                return
            if ran >= BACKOFF_RESET:
                delay = BACKOFF_START
            log.warning("replica ended; starting it again", replica=replica.spec.name, exit_code=code,
                        ran=f"{ran:.1f}s", backoff=f"{delay:g}s")
            await asyncio.sleep(delay)
            delay = min(2 * delay, BACKOFF_MAX)

    async def _run_once(self, replica: _Replica) -> tuple[int, float]:
        logs = self.directory / "logs"
        logs.mkdir(exist_ok=True)
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        with (logs / f"{replica.spec.name}.log").open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *replica.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env)
        replica.proc, replica.pid = proc, proc.pid
        replica.starts += 1
        replica.started = time.monotonic()
        (self.directory / f"{replica.spec.name}.pid").write_text(str(proc.pid))
        log.info("replica started", replica=replica.spec.name, pid=proc.pid, start=replica.starts)
        self._write_state()
        liveness = asyncio.create_task(self._liveness(replica, proc), name=f"liveness {replica.spec.name}")
        try:
            code = await proc.wait()
        finally:
            liveness.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await liveness
        replica.last_exit = code
        self._write_state()
        return code, time.monotonic() - replica.started

    async def _liveness(self, replica: _Replica, proc: asyncio.subprocess.Process) -> None:
        """The liveness probe; failures count only once the replica has passed it (a startup probe's part)."""
        failures = 0
        started = False
        while proc.returncode is None:
            began = time.monotonic()
            passed, what = await probe(replica.spec.live_url, LIVENESS_TIMEOUT)
            started = started or passed
            failures = 0 if passed or not started else failures + 1
            if failures >= LIVENESS_FAILURES:
                log.warning("liveness probe failed; ending the replica", replica=replica.spec.name,
                            failures=failures, probe=what)
                await self._end(replica, GRACE)
                return
            await asyncio.sleep(max(0.0, LIVENESS_PERIOD - (time.monotonic() - began)))

    async def _end(self, replica: _Replica, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace``; returns once the process has ended."""
        proc = replica.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace):
                await proc.wait()
        except TimeoutError:
            log.warning("replica outlived its grace period; killing it", replica=replica.spec.name)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


@attrs.frozen
class MetricsTls:
    """The replicas' metrics serving certificate (``tls.crt`` and ``tls.key`` in ``cert_dir``) and its CA."""

    cert_dir: Path
    ca_file: Path


def serving_ca(directory: Path) -> pki.KeyPair | None:
    """The serving CA of the plane running in ``directory``, or None when none runs there."""
    try:
        plane = ControlPlane.attach(directory)
    except ControlPlaneError:
        return None
    ca = pki.KeyPair(plane.ca_file, plane.ca_file.with_suffix(".key"))
    return ca if ca.cert.exists() and ca.key.exists() else None


def issue_metrics_tls(directory: Path, spec: Spec, ca: pki.KeyPair) -> MetricsTls:
    """A metrics serving certificate from ``ca`` for the replicas' hosts, in ``DIR/replicas-metrics-tls``.

    Blocking (files, key generation): call it through ``asyncio.to_thread``.
    """
    cert_dir = directory / METRICS_TLS_DIR
    cert_dir.mkdir(exist_ok=True)
    hosts = (*dict.fromkeys(r.host for r in spec.replicas), "localhost")
    pki.issue(ca, cert_dir, "tls", common_name="cozygpu-metrics", hosts=hosts, server=True)
    return MetricsTls(cert_dir, ca.cert)


async def serve(client: Client, directory: Path, stop: asyncio.Event) -> None:
    """The supervisor and the balancer until ``stop`` (the client is not needed: the replicas have their own)."""
    spec = Spec.from_json((directory / SPEC_FILE).read_text())
    ca = serving_ca(directory)  # without a plane's CA (none runs there) each replica makes a self-signed one
    tls = await asyncio.to_thread(issue_metrics_tls, directory, spec, ca) if ca is not None else None
    await Supervisor(directory, spec, metrics_tls=tls).run(stop)


# -- scraping the replicas ---------------------------------------------------------------------


def metrics_reader_rbac(namespace: str, service_account: str) -> list[dict[str, Any]]:
    """The chart's ``cozygpu-metrics-reader`` ClusterRole and its binding to ``namespace/service_account``.

    Rendered by helm from ``manifests/`` (blocking: call it through ``asyncio.to_thread``).
    """
    values = {"monitoring": {"metricsReaders": [{"namespace": namespace, "name": service_account}]}}
    return [obj for obj in chart.render(values)
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding") and obj["metadata"]["name"] == METRICS_READER]


async def prometheus_token(admin: Client, plane: ControlPlane, *, namespace: str = PROMETHEUS_NAMESPACE,
                           service_account: str = PROMETHEUS_ACCOUNT,
                           expiration_seconds: int = PROMETHEUS_TOKEN_SECONDS) -> str:
    """A token of the local plane's Prometheus, which the chart's metrics-reader ClusterRole is bound to.

    Creates the namespace and the service account when missing and applies the
    chart's ClusterRole and ClusterRoleBinding for them (idempotent), waits
    until the API server's authorizer allows the account ``get`` on
    ``/metrics`` (its RBAC cache follows a new binding within moments; a
    replica would remember a 403 for a while), then mints a token valid for
    ``expiration_seconds``: what a scrape of the replicas sends as
    ``Authorization: Bearer``.
    """
    rbac = await asyncio.to_thread(metrics_reader_rbac, namespace, service_account)
    with contextlib.suppress(errors.AlreadyExists):
        await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": namespace}})
    await apply.apply_objects(admin, rbac)
    token = await plane.service_account_token(admin, namespace=namespace, service_account=service_account,
                                              expiration_seconds=expiration_seconds)
    user = reviews.User(f"system:serviceaccount:{namespace}:{service_account}",
                        groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}"))
    for _ in range(RBAC_WAIT_ATTEMPTS):  # no event says the authorizer's cache has caught up: asked again
        if (await reviews.review_access(admin, user, path=METRICS_PATH, verb="get", timeout=10)).allowed:
            return token
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{user.name} is still not allowed get on {METRICS_PATH} after binding {METRICS_READER}")


def main(argv: Sequence[str] | None = None) -> int:
    return background.main(f"python -m {PROGRAM}",
                           "the controller replicas, started again when they end, behind a loopback balancer",
                           serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
