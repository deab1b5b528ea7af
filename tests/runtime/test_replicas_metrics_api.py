"""The local plane's replicas serve ``/metrics`` as the chart's pods do, to the plane's Prometheus token only.

A supervisor of ``cozygpu.devcluster.replicas`` runs one controller replica
against the real API server, from a command line that still names the
probes' port for the metrics (as the demo's did): the supervisor's own
``--metrics-addr`` and ``--metrics-cert-dir`` win. What it records in its
state is all a scraper needs besides the token ``prometheus_token`` mints.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
from pathlib import Path

import aiohttp

from cozygpu.devcluster import pki, replicas
from cozygpu.devcluster.plane import ControlPlane, free_port
from cozygpu.kube import Client
from tests.support.waiting import eventually


async def status_of(url: str, token: str | None, trust: ssl.SSLContext | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers,
                                                               ssl=trust if trust else False) as resp:
        return resp.status


async def test_the_local_planes_replicas_serve_metrics_over_https_to_the_planes_prometheus_only(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    health = free_port()
    argv = (sys.executable, "-m", "cozygpu", "controller", "--kubeconfig", str(plane.kubeconfig),
            "--namespace", namespace, "--identity", "metrics-a", "--log-format", "text",
            "--health-addr", f"127.0.0.1:{health}", "--metrics-addr", f"127.0.0.1:{health}")
    spec = replicas.Spec("127.0.0.1", free_port(), (replicas.ReplicaSpec("metrics-a", argv, health, free_port()),))
    ca = pki.KeyPair(plane.ca_file, plane.pki_dir / "serving-ca.key")
    tls = await asyncio.to_thread(replicas.issue_metrics_tls, tmp_path, spec, ca)
    stop = asyncio.Event()
    supervising = asyncio.create_task(replicas.Supervisor(tmp_path, spec, metrics_tls=tls).run(stop))
    try:
        async def recorded() -> list[replicas.MetricsTarget]:
            assert not supervising.done()
            return replicas.metrics_targets(tmp_path)

        (target,) = await eventually(recorded, what="the supervisor records the replica's metrics target")
        assert (target.scheme, target.host, target.path) == ("https", "127.0.0.1", "/metrics")
        assert target.port != health
        assert target.ca_file == str(plane.ca_file)
        assert not target.insecure_skip_verify
        token = await replicas.prometheus_token(admin, plane)
        trust = ssl.create_default_context(cafile=target.ca_file)

        async def scraped() -> bool:
            try:
                return await status_of(target.url, token, trust) == 200
            except aiohttp.ClientConnectorError:  # the replica is starting: not listening yet
                return False

        await eventually(scraped, timeout=60, what=f"{target.url} answers the Prometheus token")
        assert await status_of(target.url, None, trust) == 401
        stranger = await plane.service_account_token(admin, namespace=namespace, service_account="stranger")
        assert await status_of(target.url, stranger, trust) == 403
        assert await status_of(f"http://127.0.0.1:{health}/healthz", None, None) == 200
    finally:
        stop.set()
        await supervising
    log = (tmp_path / "logs" / "metrics-a.log").read_text()
    assert f"127.0.0.1:{target.port}" in log, "the replica logged where it serves its metrics"
    assert "self-signed" not in log, "the replica served the supervisor's certificate"
