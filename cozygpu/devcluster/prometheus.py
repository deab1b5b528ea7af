"""A real Prometheus on the local plane: the chart's rules over the controller replicas' ``/metrics``.

``cozygpu cluster start --prometheus`` runs prometheus (built by
``binaries.ensure_prometheus``) on a free loopback port as a background
process of the plane: pid and port in ``DIR/prometheus.json``, log in
``DIR/logs/prometheus.log``, its files (config, rules, targets, TSDB) in
``DIR/prometheus/``. ``cozygpu cluster stop`` ends it (``stop``) and
``cozygpu cluster status`` lists it (``health``).

- **Rules**: the alert and recording rules are the chart's, as helm renders
  them where the PrometheusRule kind is served (``render_rules``): the
  PrometheusRule's ``spec.groups`` are the rule file, so what fires here is
  what fires in a cluster.
- **Targets**: the replicas start after the plane (their supervisor picks
  their metrics ports), so Prometheus discovers them from a file it watches
  (``DIR/prometheus/targets.json``, file-based service discovery), which
  ``scrape_replicas`` rewrites from the supervisor's state whenever the demo
  starts them: a new run's ports are picked up without a restart. Every
  target is scraped every ``SCRAPE_INTERVAL``.
- **How a target is reached** is a ``Scrape``, one argument of ``start``:
  plain HTTP by default, or HTTPS with a bearer token file and a CA file (or
  no verification). The replicas serve ``/metrics`` as the chart's pods do
  (``replicas``: HTTPS, a certificate from the plane's serving CA, only a
  token allowed ``get`` on ``/metrics``), so the plane's Prometheus scrapes
  them with ``replicas_scrape``: the plane's CA and the token of the service
  account the chart's metrics-reader role is bound to (valid for a day).

Blocking on purpose, like ``plane``: it runs from the CLI and from pytest's
set-up, never on an event loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs
import yaml

from cozygpu.devcluster import background, binaries, chart, replicas
from cozygpu.devcluster.plane import ControlPlane, ControlPlaneError, alive, free_port, terminate
from cozygpu.kube import Client

PROMETHEUS_RULE: Final = "monitoring.coreos.com/v1/PrometheusRule"
JOB: Final = "cozygpu-controller"
SCRAPE_INTERVAL: Final = "5s"
STATE_FILE: Final = "prometheus.json"
#: Queries worth running once the demo has told its story (printed by ``cozygpu cluster start``).
QUERIES: Final = (
    ("the binder's bind answer latency since the replicas started, 99th percentile in seconds (the last 5 minutes: "
     "rate(...[5m]) of the buckets, as the dashboard and the alert read it)",
     "histogram_quantile(0.99, sum by (le) (cozygpu_binder_answer_latency_seconds_bucket))"),
    ("units free per class, as the leader counts them",
     'sum by (class) (cozygpu_binder_class_units{state="free"} * on (instance) group_left () '
     "(cozygpu_leader_is_leader == 1))"),
)
PORT_ATTEMPTS: Final = 3


@attrs.frozen(kw_only=True)
class Scrape:
    """How Prometheus reaches a controller's ``/metrics``: the scheme, and for HTTPS whom to trust and who it is."""

    scheme: Literal["http", "https"] = "http"
    #: Sent as ``Authorization: Bearer``: a service account's token the controller reviews (TokenReview).
    bearer_token_file: Path | None = None
    #: The CA that signed the controller's serving certificate.
    ca_file: Path | None = None
    insecure_skip_verify: bool = False

    def job(self, name: str, targets_file: Path, *, interval: str = SCRAPE_INTERVAL) -> dict[str, Any]:
        """A scrape config reading its targets from ``targets_file`` (file-based discovery)."""
        config: dict[str, Any] = {
            "job_name": name, "scrape_interval": interval, "scrape_timeout": interval,
            "scheme": self.scheme, "metrics_path": "/metrics",
            "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": interval}],
        }
        if self.bearer_token_file is not None:
            config["authorization"] = {"type": "Bearer", "credentials_file": str(self.bearer_token_file)}
        tls = {**({"ca_file": str(self.ca_file)} if self.ca_file is not None else {}),
               **({"insecure_skip_verify": True} if self.insecure_skip_verify else {})}
        if tls:
            config["tls_config"] = tls
        return config


def config(rules_file: Path, jobs: Sequence[Mapping[str, Any]], *, interval: str = SCRAPE_INTERVAL) -> dict[str, Any]:
    """prometheus.yml: ``jobs`` scraped and the rules evaluated every ``interval``."""
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(rules_file)], "scrape_configs": [dict(job) for job in jobs]}


def rule_groups(objects: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rule groups of every PrometheusRule among rendered chart objects: a Prometheus rule file's ``groups``."""
    return [dict(group) for obj in objects if obj.get("kind") == "PrometheusRule"
            for group in obj["spec"]["groups"]]


def render_rules(*, kube_version: str = binaries.DEFAULT_MINOR,
                 values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's rule groups, rendered by helm (``chart.render``) for a cluster that serves PrometheusRule."""
    return rule_groups(chart.render(values, api_versions=(*chart.EVERYTHING_SERVED, PROMETHEUS_RULE),
                                    kube_version=kube_version))


def files(directory: Path) -> Path:
    """Where the plane in ``directory`` keeps Prometheus's config, rules, targets and TSDB."""
    return directory / "prometheus"


def targets_file(directory: Path) -> Path:
    return files(directory) / "targets.json"


def write_targets(directory: Path, targets: Mapping[str, str]) -> None:
    """Scrape ``targets`` (replica name -> host:port), each labelled ``pod`` with its name as the chart's
    ServiceMonitor labels a replica (the ledger's rules deduplicate ``without (instance, pod)``); replaces the
    file in one rename."""
    path = targets_file(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    groups = [{"targets": [address], "labels": {"pod": name}} for name, address in sorted(targets.items())]
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(groups, indent=2))
    os.replace(partial, path)  # Prometheus never reads half a file


def scrape_replicas(directory: Path) -> None:
    """The controller replicas the supervisor in ``directory`` runs are the targets from now on."""
    write_targets(directory, {target.replica: target.address for target in replicas.metrics_targets(directory)})


async def replicas_scrape(admin: Client, plane: ControlPlane) -> Scrape:
    """How to scrape the plane's replicas: HTTPS verified by the plane's serving CA, with a Prometheus token.

    The token is minted by ``replicas.prometheus_token`` (which binds the
    chart's metrics-reader role to Prometheus's service account) and kept in
    ``DIR/prometheus/token``, readable only by its owner.
    """
    token = await replicas.prometheus_token(admin, plane)
    path = files(plane.directory) / "token"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(token)
    return Scrape(scheme="https", bearer_token_file=path, ca_file=plane.ca_file)


@attrs.frozen
class Prometheus:
    """A Prometheus a ``start`` left running for the plane in ``directory``."""

    directory: Path
    pid: int
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def attach(cls, directory: Path) -> Prometheus | None:
        """The Prometheus recorded in ``directory``, or None when none was started there."""
        try:
            state = json.loads((directory / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        return cls(directory, int(state["pid"]), int(state["port"]))

    def health(self) -> tuple[str, int, str]:
        """("prometheus", pid, ``ok`` | ``unhealthy: ...`` | ``not running``), as ``cozygpu cluster status`` lists."""
        if not alive(self.pid, "prometheus"):
            return "prometheus", self.pid, "not running"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return "prometheus", self.pid, "ok" if resp.status == 200 else f"unhealthy: HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as err:
            return "prometheus", self.pid, f"unhealthy: {err}"

    def stop(self, *, timeout: float = 15.0) -> None:
        terminate(self.pid, timeout, expect="prometheus")
        for name in (STATE_FILE, "prometheus.pid"):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / name).unlink()


def start(directory: Path, groups: Sequence[Mapping[str, Any]], *, scrape: Scrape = Scrape(),
          bins: binaries.PrometheusBinaries | None = None, timeout: float = 60.0) -> Prometheus:
    """Prometheus for the plane in ``directory``, evaluating ``groups``, ready (``/-/ready``) when it returns.

    The targets are what ``targets.json`` holds (none until ``write_targets``
    writes it). ``bins`` defaults to the cached build,
    built when missing.
    """
    if (recorded := Prometheus.attach(directory)) is not None:
        if alive(recorded.pid, "prometheus"):
            raise ControlPlaneError(f"{directory} already runs a Prometheus; stop it first (cozygpu cluster stop)")
        recorded.stop()  # what a killed run left recorded
    bins = bins or binaries.ensure_prometheus()
    home = files(directory)
    home.mkdir(parents=True, exist_ok=True)
    rules = home / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [dict(g) for g in groups]}, sort_keys=False))
    if not targets_file(directory).exists():
        write_targets(directory, {})
    (home / "prometheus.yml").write_text(yaml.safe_dump(
        config(rules, [scrape.job(JOB, targets_file(directory))]), sort_keys=False))
    log = directory / "logs" / "prometheus.log"
    # A free port is picked by binding it and closing it, which can race with another process: retried.
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port, logged = free_port(), log.stat().st_size if log.exists() else 0
        proc = background.spawn([
            str(bins.prometheus), f"--config.file={home / 'prometheus.yml'}",
            f"--storage.tsdb.path={home / 'data'}", "--storage.tsdb.retention.time=1d",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ], log=log, pid_file=directory / "prometheus.pid")
        running = Prometheus(directory, proc.pid, port)
        (directory / STATE_FILE).write_text(json.dumps({"pid": proc.pid, "port": port}))
        try:
            _wait_ready(running, proc, timeout, log)
            return running
        except ControlPlaneError:
            running.stop()
            if attempt == PORT_ATTEMPTS or b"address already in use" not in log.read_bytes()[logged:]:
                raise
    raise AssertionError("unreachable")


def stop(directory: Path) -> None:
    """End the Prometheus recorded in ``directory``, if any."""
    if (running := Prometheus.attach(directory)) is not None:
        running.stop()


def health(directory: Path) -> list[tuple[str, int, str]]:
    """The status row of the Prometheus recorded in ``directory`` (none when there is none)."""
    running = Prometheus.attach(directory)
    return [running.health()] if running is not None else []


def _wait_ready(running: Prometheus, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ControlPlaneError(f"prometheus exited with code {proc.returncode} before it was ready; "
                                    f"the end of {log}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(f"{running.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as err:
            last = str(err)
        time.sleep(0.1)  # another process: polled, as the plane polls its components
    raise ControlPlaneError(f"prometheus was not ready within {timeout:.0f} s ({running.url}/-/ready: {last})")


def _tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
