"""The probe, metrics and webhook servers, on loopback, without a control plane (the reviews are a fake)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry, Counter

from cozygpu.devcluster import pki
from cozygpu.runtime.flags import Address
from cozygpu.runtime.metrics_auth import ScrapeAuth
from cozygpu.runtime.selfsigned import self_signed_context
from cozygpu.runtime.servers import SCRAPE_LIMITS, Endpoint, Readiness, metrics_app, probe_app, serve
from cozygpu.runtime.webhook import ServingCertificate, webhook_app
from tests.runtime.reviewers import FakeReviewer

LOOPBACK = Address("127.0.0.1", 0)
READER = "system:serviceaccount:cozy-monitoring:prometheus"
NOBODY = "system:serviceaccount:default:nobody"


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


def probes(readiness: Readiness) -> list[Endpoint]:
    return [Endpoint("health", LOOPBACK, probe_app(readiness))]


async def test_readyz_fails_with_every_failing_check_named_until_all_pass() -> None:
    problems: dict[str, str | None] = {"caches": "not synced: gpudevices", "webhooks": "not serving yet"}
    readiness = Readiness()
    readiness.add("caches", lambda: problems["caches"])
    readiness.add("webhooks", lambda: problems["webhooks"])
    async with serving(probes(readiness)) as bound:
        base = f"http://127.0.0.1:{bound['health'].port}"
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
    async with serving(probes(readiness)) as bound:
        status, _, body = await get(f"http://127.0.0.1:{bound['health'].port}/readyz")
    assert status == 503
    assert "check raised ZeroDivisionError" in body


class Scraping:
    """A probe server and an HTTPS metrics server (self-signed) over a fake reviewer, and a way to scrape it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        Counter("cozygpu_test_things", "Things.", registry=self.registry).inc(3)
        self.reviewer = FakeReviewer({"good": READER, "other": NOBODY}, allowed={READER})
        self.auth = ScrapeAuth(self.reviewer, registry=self.registry)
        context, pem = self_signed_context(["127.0.0.1", "localhost"])
        self.trust = ssl.create_default_context(cadata=pem.decode())
        self.endpoints = [*probes(Readiness()),
                          Endpoint("metrics", LOOPBACK, metrics_app(self.registry, self.auth, after=(self.rendered,)),
                                   context, SCRAPE_LIMITS)]
        self.bound: dict[str, Address] = {}

    @staticmethod
    def rendered() -> bytes:
        """A family that renders itself, as the per-node ones do."""
        return b"# TYPE cozygpu_test_rendered gauge\ncozygpu_test_rendered 7.0\n"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.bound['metrics'].port}/metrics"

    async def scrape(self, token: str | None = None, *, headers: dict[str, str] | None = None,
                     body: bytes | None = None) -> tuple[int, aiohttp.ClientResponse, str]:
        sent = {**({"Authorization": f"Bearer {token}"} if token is not None else {}), **(headers or {})}
        async with aiohttp.ClientSession() as session, \
                session.get(self.url, headers=sent, data=body, ssl=self.trust) as resp:
            return resp.status, resp, await resp.text()


@pytest.fixture
async def scraping() -> AsyncIterator[Scraping]:
    setup = Scraping()
    async with serving(setup.endpoints) as bound:
        setup.bound = bound
        yield setup


async def test_metrics_are_served_over_https_to_an_allowed_token_only(scraping: Scraping) -> None:
    status, resp, text = await scraping.scrape("good")
    assert status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    assert "cozygpu_test_things_total 3.0" in text
    assert 'cozygpu_metrics_auth_total{result="allowed"} 1.0' in text
    assert text.endswith("\ncozygpu_test_rendered 7.0\n"), "a family that renders itself, after the registry's"
    status, resp, text = await scraping.scrape()
    assert status == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert "cozygpu_test_things" not in text
    assert "cozygpu_test_rendered" not in text
    status, _, text = await scraping.scrape("forged")
    assert status == 401
    status, _, text = await scraping.scrape("other")
    assert status == 403
    assert NOBODY in text
    assert "cozygpu_test_things" not in text


async def test_the_probes_are_plain_http_without_a_token_and_the_metrics_port_answers_no_plain_http(
        scraping: Scraping) -> None:
    health = scraping.bound["health"].port
    assert (await get(f"http://127.0.0.1:{health}/healthz"))[0] == 200
    assert (await get(f"http://127.0.0.1:{health}/readyz"))[0] == 200
    assert (await get(f"http://127.0.0.1:{health}/metrics"))[0] == 404
    with pytest.raises(aiohttp.ClientError):
        await get(scraping.url.replace("https://", "http://"))
    assert scraping.reviewer.asked == []


async def test_the_self_signed_certificate_is_valid_for_the_hosts_it_was_made_for(scraping: Scraping) -> None:
    context = scraping.trust
    port = scraping.bound["metrics"].port
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
    writer.close()
    with pytest.raises(ssl.SSLCertVerificationError):
        await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="metrics.example")


async def test_a_scrape_with_a_body_is_refused_413_unread_and_unreviewed(scraping: Scraping) -> None:
    status, resp, _ = await scraping.scrape("good", body=b"x" * 100_000)
    assert status == 413
    assert resp.headers.get("Connection", "").lower() == "close"
    assert scraping.reviewer.asked == []


async def test_a_header_longer_than_the_bound_is_refused_before_any_review(scraping: Scraping) -> None:
    status, _, _ = await scraping.scrape("a" * (SCRAPE_LIMITS.max_field_size + 1))
    assert status in (400, 431)
    many = {f"X-Filler-{i}": "x" for i in range(SCRAPE_LIMITS.max_headers + 1)}
    status, _, _ = await scraping.scrape("good", headers=many)
    assert status in (400, 431)
    assert scraping.reviewer.asked == []
    status, _, _ = await scraping.scrape("good", headers={"X-Filler": "x" * 4000})
    assert status == 200, "a header within the bound is read"


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
