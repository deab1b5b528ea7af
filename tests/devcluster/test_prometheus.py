"""A real Prometheus on loopback: it scrapes a real controller, evaluates the chart's rules, and the CLI runs it.

The first test runs a controller in the test's loop against the fast plane
(as ``tests/chart/test_observability.py`` does), its ``/metrics`` served as
the local plane's replicas serve theirs (HTTPS, a certificate from the
plane's serving CA, a token allowed ``get`` on ``/metrics``), points
Prometheus's target file at it and reads the binder's figures back through
Prometheus's HTTP API, with the queries ``cozygpu cluster start --prometheus``
prints. The second starts a fast plane with Prometheus through the CLI.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import yaml

from cozygpu.devcluster import prometheus
from cozygpu.devcluster.plane import ControlPlane, alive
from cozygpu.kube import Client
from cozygpu.runtime.controller import Controller
from tests.binder.test_controller_binder_api import serving_cert
from tests.binder.world import World
from tests.chart.test_promtool import prometheus_binaries, promtool
from tests.devcluster.test_plane import status_rows
from tests.runtime.scraping import metrics_reader_token, scrape
from tests.runtime.test_controller_readiness import eventually, get, options, running
from tests.support.crds import install_fixture_crd
from tests.support.processes import gone


async def api(url: str, path: str, **params: str) -> Any:
    status, body = await get(f"{url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
    assert status == 200, body
    answer = json.loads(body)
    assert answer["status"] == "success", answer
    return answer["data"]


async def query(url: str, expr: str) -> list[tuple[dict[str, str], float]]:
    """An instant query's samples: (labels, value)."""
    data = await api(url, "query", query=expr)
    return [(sample["metric"], float(sample["value"][1])) for sample in data["result"]]


async def test_prometheus_scrapes_a_real_controller_and_answers_the_printed_queries(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    bins = prometheus_binaries()
    await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
    world = await World.make(admin, namespace)
    started: prometheus.Prometheus | None = None
    try:
        await world.node("n1", 2)
        await world.order("held", 1)
        serving_cert(plane, tmp_path)  # the webhook's and /metrics' certificate, from the plane's serving CA
        token = await metrics_reader_token(plane, admin, namespace)
        controller = Controller(options(f"ctl-{uuid.uuid4().hex[:6]}", "--enable-gpu", "--cert-dir",
                                        str(tmp_path), "--metrics-cert-dir", str(tmp_path)), admin)
        await admin.create("/api/v1/namespaces", {"metadata": {"name": controller.options.namespace}})
        async with running(controller):
            async def bound() -> bool:
                text = (await scrape(controller, token))[1]
                return f'cozygpu_binder_devices{{class="{world.gpu_class}",phase="Bound"}} 1.0' in text

            await eventually(bound, timeout=60)
            directory = tmp_path / "plane"
            port = controller.bound["metrics"].port
            prometheus.write_targets(directory, {"controller-a": f"127.0.0.1:{port}"})
            (tmp_path / "token").write_text(token)
            scraping = prometheus.Scrape(scheme="https", bearer_token_file=tmp_path / "token", ca_file=plane.ca_file)
            groups = await asyncio.to_thread(prometheus.render_rules)
            started = await asyncio.to_thread(prometheus.start, directory, groups, scrape=scraping, bins=bins)
            checked = promtool("check", "config", str(prometheus.files(directory) / "prometheus.yml"))
            assert checked.returncode == 0, checked.stdout + checked.stderr

            async def target_up() -> dict[str, Any] | None:
                assert started is not None
                targets = (await api(started.url, "targets"))["activeTargets"]
                return next((t for t in targets if t["health"] == "up"), None)

            await eventually(target_up, timeout=30)
            (target,) = (await api(started.url, "targets"))["activeTargets"]
            assert target["labels"] == {"instance": f"127.0.0.1:{port}", "job": prometheus.JOB,
                                        "pod": "controller-a"}
            assert target["scrapeInterval"] == prometheus.SCRAPE_INTERVAL
            assert target["scrapeUrl"] == f"https://127.0.0.1:{port}/metrics"
            devices = f'cozygpu_binder_devices{{class="{world.gpu_class}"}}'

            async def scraped() -> list[tuple[dict[str, str], float]] | None:
                assert started is not None
                return await query(started.url, devices) or None

            await eventually(scraped, timeout=15)  # the target reads up once its first scrape is appended
            bound_device = {"__name__": "cozygpu_binder_devices", "class": world.gpu_class, "phase": "Bound",
                            "instance": f"127.0.0.1:{port}", "job": prometheus.JOB, "pod": "controller-a"}
            assert (bound_device, 1.0) in await query(started.url, devices)
            latency, free_units = (expr for _, expr in prometheus.QUERIES)
            free = {labels["class"]: value for labels, value in await query(started.url, free_units)}
            assert free[world.gpu_class] == 1.0, free
            # No bind request was answered: the quantile is NaN, but over the leader's buckets as scraped.
            assert [labels for labels, _ in await query(started.url, latency)] == [{}]
            rules = (await api(started.url, "rules"))["groups"]
            assert {r["name"] for g in rules for r in g["rules"]} == {
                r.get("alert") or r["record"] for g in groups for r in g["rules"]}
            assert {r["health"] for g in rules for r in g["rules"]} <= {"ok", "unknown"}
    finally:
        if started is not None:
            started.stop()
            assert gone(started.pid)
        await world.cleanup()


def cozygpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cozygpu.cli", *args], capture_output=True, text=True,
                          check=False, timeout=180)


def test_cluster_start_with_prometheus_prints_it_status_lists_it_and_stop_ends_it(
        plane: ControlPlane, tmp_path: Path) -> None:
    # `plane` proves the control plane's binaries exist (or fails under CI); this test starts one more.
    prometheus_binaries()
    directory = tmp_path / "cluster"
    started = cozygpu("cluster", "start", "--api-only", "--prometheus", "--dir", str(directory))
    assert started.returncode == 0, started.stderr
    try:
        recorded = prometheus.Prometheus.attach(directory)
        assert recorded is not None
        assert f"Prometheus 3.16.0 at {recorded.url}" in started.stdout
        for _, expr in prometheus.QUERIES:
            assert f"curl -s {recorded.url}/api/v1/query --data-urlencode 'query={expr}'" in started.stdout
        config = yaml.safe_load((prometheus.files(directory) / "prometheus.yml").read_text())
        (job,) = config["scrape_configs"]
        assert (job["scheme"], job["scrape_interval"]) == ("https", "5s")
        assert job["tls_config"] == {"ca_file": str(directory / "pki" / "serving-ca.crt")}
        token = Path(job["authorization"]["credentials_file"])
        assert token.stat().st_mode & 0o777 == 0o600
        assert token.read_text().count(".") == 2, "a service account token (a JWT)"
        assert job["file_sd_configs"] == [{"files": [str(prometheus.targets_file(directory))],
                                           "refresh_interval": "5s"}]
        rules = yaml.safe_load((prometheus.files(directory) / "rules.yaml").read_text())
        assert rules["groups"] == prometheus.render_rules()
        status = cozygpu("cluster", "status", "--dir", str(directory))
        assert status.returncode == 0, status.stdout
        assert status_rows(status.stdout)["prometheus"] == (recorded.pid, "ok")
    finally:
        stopped = cozygpu("cluster", "stop", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr
    assert gone(recorded.pid)
    assert not alive(recorded.pid)
    assert prometheus.Prometheus.attach(directory) is None


def test_the_scrape_config_takes_https_a_bearer_token_and_a_ca(tmp_path: Path) -> None:
    """The switch to an HTTPS /metrics behind TokenReview is one ``Scrape``: promtool accepts what it writes."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    job = prometheus.Scrape(scheme="https", bearer_token_file=token, ca_file=ca).job("j", tmp_path / "t.json")
    assert job["authorization"] == {"type": "Bearer", "credentials_file": str(token)}
    assert job["tls_config"] == {"ca_file": str(ca)}
    insecure = prometheus.Scrape(scheme="https", insecure_skip_verify=True).job("k", tmp_path / "t.json")
    assert insecure["tls_config"] == {"insecure_skip_verify": True}
    assert "tls_config" not in prometheus.Scrape().job("l", tmp_path / "t.json")
    token.write_text("a-token")
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    config = prometheus.config(tmp_path / "rules.yaml", [job, insecure])
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    checked = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
