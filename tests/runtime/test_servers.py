"""The probe, metrics and webhook servers, on loopback, without a control plane."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import aiohttp
from cryptography import x509
from prometheus_client import CollectorRegistry, Counter

from cozygpu.devcluster import pki
from cozygpu.runtime.flags import Address
from cozygpu.runtime.servers import Endpoint, Readiness, probe_and_metrics, serve
from cozygpu.runtime.webhook import ServingCertificate, webhook_app

LOOPBACK = Address("127.0.0.1", 0)


@asynccontextmanager
async def serving(endpoints: list[Endpoint]) -> AsyncIterator[dict[str, Address]]:
    bound: dict[str, Address] = {}
    up = asyncio.Event()
    task = asyncio.create_task(serve(endpoints, up.set, on_bound=lambda name, addr: bound.__setitem__(name, addr)))
    try:
        async with asyncio.timeout(10):
            await up.wait()
        yield bound
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_readyz_fails_with_every_failing_check_named_until_all_pass() -> None:
    problems: dict[str, str | None] = {"caches": "not synced: gpudevices", "webhooks": "not serving yet"}
    readiness = Readiness()
    readiness.add("caches", lambda: problems["caches"])
    readiness.add("webhooks", lambda: problems["webhooks"])
    async with serving(probe_and_metrics(LOOPBACK, LOOPBACK, readiness, CollectorRegistry())) as bound:
        base = f"http://127.0.0.1:{bound['health+metrics'].port}"
        status, _, body = await get(f"{base}/readyz")
        assert status == 503
        assert "[-]caches failed: not synced: gpudevices" in body
        assert "[-]webhooks failed: not serving yet" in body
        problems["caches"] = None
        status, _, body = await get(f"{base}/readyz")
        assert status == 503
        assert "[+]caches ok" in body
        problems["webhooks"] = None
        assert (await get(f"{base}/readyz"))[0] == 200
        assert (await get(f"{base}/healthz"))[0] == 200


async def test_a_check_that_raises_reads_as_not_ready_not_as_a_server_error() -> None:
    readiness = Readiness()
    readiness.add("broken", lambda: str(1 / 0))
    async with serving(probe_and_metrics(LOOPBACK, LOOPBACK, readiness, CollectorRegistry())) as bound:
        status, _, body = await get(f"http://127.0.0.1:{bound['health+metrics'].port}/readyz")
    assert status == 503
    assert "check raised ZeroDivisionError" in body


async def test_probes_and_metrics_on_different_addresses_are_two_servers() -> None:
    registry = CollectorRegistry()
    Counter("cozygpu_test_things", "Things.", registry=registry).inc(3)
    readiness = Readiness()
    other = Address("127.0.0.2", 0)
    async with serving(probe_and_metrics(LOOPBACK, other, readiness, registry)) as bound:
        status, content_type, text = await get(f"http://127.0.0.2:{bound['metrics'].port}/metrics")
        assert status == 200
        assert content_type.startswith("text/plain")
        assert "cozygpu_test_things_total 3.0" in text
        assert (await get(f"http://127.0.0.2:{bound['metrics'].port}/readyz"))[0] == 404
        assert (await get(f"http://127.0.0.1:{bound['health'].port}/readyz"))[0] == 200
        assert (await get(f"http://127.0.0.1:{bound['health'].port}/metrics"))[0] == 404


async def serial_of_served_certificate(port: int, ca: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        with suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


def issue_into(ca: pki.KeyPair, directory: Path, name: str) -> int:
    pair = pki.issue(ca, directory, name, common_name="webhook", hosts=("127.0.0.1",), server=True)
    pair.cert.replace(directory / "tls.crt")
    pair.key.replace(directory / "tls.key")
    return x509.load_pem_x509_certificate((directory / "tls.crt").read_bytes()).serial_number


async def test_the_webhook_server_serves_404_over_tls_and_picks_up_a_rotated_certificate(tmp_path: Path) -> None:
    ca = pki.make_ca(tmp_path, "ca")
    certs = tmp_path / "certs"
    certs.mkdir()
    first = issue_into(ca, certs, "first")
    certificate = ServingCertificate(certs)
    context = await certificate.load()
    follower = asyncio.create_task(certificate.follow(interval=0.05))
    try:
        async with serving([Endpoint("webhooks", LOOPBACK, webhook_app(), context)]) as bound:
            port = bound["webhooks"].port
            assert await serial_of_served_certificate(port, ca.cert) == first
            tls = ssl.create_default_context(cafile=str(ca.cert))
            async with aiohttp.ClientSession() as session, \
                    session.post(f"https://127.0.0.1:{port}/mutate-vmi", json={}, ssl=tls) as resp:
                assert resp.status == 404
            await asyncio.sleep(0.05)  # a new mtime, even on coarse file systems
            second = issue_into(ca, certs, "second")
            async with asyncio.timeout(5):
                while True:
                    if await serial_of_served_certificate(port, ca.cert) == second:
                        break
                    await asyncio.sleep(0.05)
    finally:
        follower.cancel()
        with suppress(asyncio.CancelledError):
            await follower
