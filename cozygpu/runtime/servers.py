"""The probe and metrics servers (R-RUN-5), run inside the process's one event loop.

- ``/healthz`` answers 200 while the event loop answers at all: a wedged
  loop is what a liveness probe should restart.
- ``/readyz`` answers 200 only when every readiness check passes, else 503
  naming each failing check and why (``[-]caches failed: ...``). The checks
  are registered by the process: the webhook caches have synced (R-RUN-2),
  the webhook server is serving, the process is not shutting down.
- ``/metrics`` serves the process's own Prometheus registry.

Each server is an aiohttp ``AppRunner`` with one ``TCPSite``; ``serve()``
runs a group of them until cancelled, then closes them. Port 0 binds a free
port; the bound address is logged (``serving``) and handed to ``on_bound``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from typing import Final

import attrs
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cozygpu.base.logging import get_logger
from cozygpu.runtime.flags import Address
from cozygpu.runtime.metrics import ProcessMetrics

_log = get_logger("cozygpu.servers")

#: A readiness check: None when ready, else why not.
Check = Callable[[], str | None]
#: How long a closing server waits for requests in flight.
SHUTDOWN_TIMEOUT: Final = 5.0


class Readiness:
    """Named readiness checks; ready when every one passes."""

    def __init__(self, metrics: ProcessMetrics | None = None) -> None:
        self._checks: dict[str, Check] = {}
        self._metrics = metrics

    def add(self, name: str, check: Check) -> None:
        if name in self._checks:
            raise ValueError(f"readiness check {name!r} is already registered")
        self._checks[name] = check

    def results(self) -> list[tuple[str, str | None]]:
        """Every check's answer, in registration order (None: passed)."""
        out: list[tuple[str, str | None]] = []
        for name, check in self._checks.items():
            try:
                out.append((name, check()))
            except Exception as err:  # a broken check is a failing check, never a 500
                out.append((name, f"check raised {type(err).__name__}: {err}"))
        if self._metrics is not None:
            self._metrics.ready.set(1 if all(problem is None for _, problem in out) else 0)
        return out

    def ready(self) -> bool:
        return all(problem is None for _, problem in self.results())


@attrs.frozen
class Endpoint:
    """One server to run: where, what, and with which TLS (None for plain HTTP)."""

    name: str
    address: Address
    app: web.Application
    ssl_context: ssl.SSLContext | None = None


def probe_routes(app: web.Application, readiness: Readiness) -> None:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        results = readiness.results()
        ok = all(problem is None for _, problem in results)
        lines = [f"[+]{name} ok" if problem is None else f"[-]{name} failed: {problem}" for name, problem in results]
        lines.append("readyz check passed" if ok else "readyz check failed")
        return web.Response(status=200 if ok else 503, text="\n".join(lines) + "\n")

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


def metrics_routes(app: web.Application, registry: CollectorRegistry) -> None:
    async def metrics(_: web.Request) -> web.Response:
        # Off the event loop: at 5,000 nodes the exposition of the per-node series takes half a second,
        # which would stall every watch and webhook of the replica at each scrape (collectors take locks).
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/metrics", metrics)


def probe_and_metrics(health: Address, metrics: Address, readiness: Readiness,
                      registry: CollectorRegistry) -> list[Endpoint]:
    """The probe and metrics servers; one server when both flags name the same address."""
    if health == metrics:
        app = web.Application()
        probe_routes(app, readiness)
        metrics_routes(app, registry)
        return [Endpoint("health+metrics", health, app)]
    probes, scrape = web.Application(), web.Application()
    probe_routes(probes, readiness)
    metrics_routes(scrape, registry)
    return [Endpoint("health", health, probes), Endpoint("metrics", metrics, scrape)]


async def serve(endpoints: Sequence[Endpoint], ready: Callable[[], None], *,
                on_bound: Callable[[str, Address], None] | None = None) -> None:
    """Start every endpoint, call ``ready()``, serve until cancelled, then close them all."""
    runners: list[web.AppRunner] = []
    try:
        for endpoint in endpoints:
            runner = web.AppRunner(endpoint.app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
            runners.append(runner)
            await runner.setup()
            site = web.TCPSite(runner, endpoint.address.host, endpoint.address.port,
                               ssl_context=endpoint.ssl_context)
            await site.start()
            bound = _bound_address(runner, endpoint.address)
            _log.info("serving", server=endpoint.name, address=str(bound),
                      scheme="https" if endpoint.ssl_context is not None else "http")
            if on_bound is not None:
                on_bound(endpoint.name, bound)
        ready()
        await asyncio.Future()
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


def _bound_address(runner: web.AppRunner, asked: Address) -> Address:
    for sockname in runner.addresses:
        if isinstance(sockname, tuple) and len(sockname) >= 2:
            return Address(asked.host, int(sockname[1]))
    return asked
