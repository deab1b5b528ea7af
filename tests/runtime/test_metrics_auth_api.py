"""``/metrics`` is HTTPS and answers only a token the real API server allows ``get`` on ``/metrics`` (R-LEDGER-3).

One controller per test, run in the test's loop against the real API
server; the scrapers are service accounts of the test's namespace, with
tokens the API server mints. The probes stay plain HTTP without a token.
"""

from __future__ import annotations

import re
import ssl
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cozygpu.devcluster import pki
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client
from cozygpu.runtime.controller import Controller
from cozygpu.runtime.metrics_auth import DENY_TTL
from tests.runtime.scraping import metrics_reader_token, scrape
from tests.runtime.test_controller_readiness import (
    BASE_RULES,
    DEVICE_RULES,
    eventually,
    get,
    grant,
    options,
    running,
)

REVIEW_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]


def metrics_certificate(plane: ControlPlane, directory: Path) -> Path:
    """A metrics serving certificate for 127.0.0.1 from the plane's serving CA, as tls.crt and tls.key."""
    directory.mkdir()
    ca = pki.KeyPair(plane.ca_file, plane.pki_dir / "serving-ca.key")
    pki.issue(ca, directory, "tls", common_name="cozygpu-metrics", hosts=("127.0.0.1",), server=True)
    return directory


def forged(token: str) -> str:
    """The token with its signature changed: the same claims, signed by no one the API server trusts."""
    header, claims, signature = token.split(".")
    return f"{header}.{claims}.{signature[::-1]}"


async def test_a_scrape_is_answered_401_403_or_200_as_the_api_server_reviews_its_token(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    reader = await metrics_reader_token(plane, admin, namespace)
    stranger = await plane.service_account_token(admin, namespace=namespace, service_account="stranger")
    certs = metrics_certificate(plane, tmp_path / "metrics-tls")
    controller = Controller(options(namespace, "--metrics-cert-dir", str(certs)), admin)
    trust = ssl.create_default_context(cafile=str(plane.ca_file))
    async with running(controller) as probes:
        status, text = await scrape(controller, None, context=trust)
        assert status == 401, text
        assert "cozygpu_" not in text
        assert (await scrape(controller, "not-a-token-the-api-server-issued", context=trust))[0] == 401
        assert (await scrape(controller, forged(reader), context=trust))[0] == 401

        status, text = await scrape(controller, stranger, context=trust)
        assert status == 403, text
        assert f"system:serviceaccount:{namespace}:stranger may not get /metrics" in text
        assert "cozygpu_" not in text

        status, text = await scrape(controller, reader, context=trust)
        assert status == 200, text
        assert "# TYPE cozygpu_ready gauge" in text
        assert 'cozygpu_metrics_auth_total{result="unauthenticated"} 3.0' in text
        assert 'cozygpu_metrics_auth_total{result="forbidden"} 1.0' in text
        assert 'cozygpu_metrics_auth_total{result="allowed"} 1.0' in text
        assert 'cozygpu_metrics_auth_reviews_total{review="access"} 2.0' in text

        # The probes: plain HTTP, no token, and /metrics is not among them.
        assert (await get(f"{probes}/healthz"))[0] == 200

        async def ready() -> bool:
            return (await get(f"{probes}/readyz"))[0] == 200

        await eventually(ready, timeout=60)
        assert (await get(f"{probes}/metrics"))[0] == 404


async def test_without_a_certificate_the_controller_serves_one_it_made_at_start(
        plane: ControlPlane, admin: Client, namespace: str) -> None:
    reader = await metrics_reader_token(plane, admin, namespace)
    controller = Controller(options(namespace), admin)
    async with running(controller):
        status, text = await scrape(controller, reader)  # not verified, as the chart's default ServiceMonitor
        assert status == 200, text
        assert "cozygpu_leader_is_leader" in text
        trust = ssl.create_default_context(cafile=str(plane.ca_file))
        with pytest.raises(aiohttp.ClientConnectorCertificateError):  # signed by no CA the plane knows
            await scrape(controller, reader, context=trust)


async def test_a_controller_that_may_not_ask_the_reviews_answers_500_and_remembers_nothing(
        plane: ControlPlane, admin: Client, namespace: str) -> None:
    """A refusal of the controller's own review is an error, not a denial: granted the right, it answers at once."""
    reader = await metrics_reader_token(plane, admin, namespace)
    user = f"controller-{uuid.uuid4().hex[:8]}"
    for name, rules in (("base", BASE_RULES), ("devices", DEVICE_RULES)):
        await grant(admin, user, name, rules)
    async with plane.client(user, ()) as client:
        controller = Controller(options(namespace), client)
        async with running(controller):
            status, text = await scrape(controller, reader)
            assert status == 500, text
            assert "refused the controller's review of the token (403)" in text

            await grant(admin, user, "reviews", REVIEW_RULES)

            async def allowed() -> bool:
                return (await scrape(controller, reader))[0] == 200

            # Well before a denial would have expired from the cache: nothing was cached.
            await eventually(allowed, timeout=DENY_TTL / 2, every=0.1)
            text = (await scrape(controller, reader))[1]
            errors = re.search(r'^cozygpu_metrics_auth_total\{result="error"\} ([0-9.]+)$', text, re.M)
            assert errors is not None, text
            assert float(errors.group(1)) >= 1
