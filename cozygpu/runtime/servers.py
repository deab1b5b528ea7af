"""The probe and metrics servers (R-RUN-5), run inside the process's one event loop.

- ``/healthz`` answers 200 while the event loop answers at all: a wedged
  loop is what a liveness probe should restart.
- ``/readyz`` answers 200 only when every readiness check passes, else 503
  naming each failing check and why (``[-]caches failed: ...``). The checks
  are registered by the process: the webhook caches have synced (R-RUN-2),
  the webhook server is serving, the process is not shutting down.
- ``/metrics`` serves the process's own Prometheus registry, on a server of
  its own, over HTTPS only, to a caller whose bearer token the API server
  allows ``get`` on ``/metrics`` (``metrics_auth``; R-LEDGER-3). The probes
  stay plain HTTP and ask for no token: kubelet probes them so.

Each server is an aiohttp ``AppRunner`` with one ``TCPSite``; ``serve()``
runs a group of them until cancelled, then closes them. Port 0 binds a free
port; the bound address is logged (``serving``) and handed to ``on_bound``.
An endpoint's ``limits`` bound what a request may make the server read: the
metrics server takes a short request line, few and short headers (the token
is the longest) and no body, and never lingers to drain one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import attrs
from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cozygpu.base.logging import get_logger
from cozygpu.runtime.flags import Address
from cozygpu.runtime.metrics import ProcessMetrics
from cozygpu.runtime.metrics_auth import METRICS_PATH, ScrapeAuth

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


@attrs.frozen(kw_only=True)
class RequestLimits:
    """What one request may make a server read (aiohttp's request handler settings)."""

    #: The request line's bytes.
    max_line_size: int
    #: One header's bytes, name and value.
    max_field_size: int
    #: How many headers.
    max_headers: int
    #: How long the server reads (and drops) a body the handler did not read; 0: it closes instead.
    lingering_time: float


#: A scrape: ``GET /metrics`` with a few headers, the bearer token the longest (a service account's is
#: about 1 KiB), and no body.
SCRAPE_LIMITS: Final = RequestLimits(max_line_size=2048, max_field_size=8192, max_headers=32, lingering_time=0.0)


@attrs.frozen
class Endpoint:
    """One server to run: where, what, with which TLS (None for plain HTTP) and request limits (None: aiohttp's)."""

    name: str
    address: Address
    app: web.Application
    ssl_context: ssl.SSLContext | None = None
    limits: RequestLimits | None = None


def probe_app(readiness: Readiness) -> web.Application:
    """``/healthz`` and ``/readyz``, plain HTTP, no token (kubelet's probes)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        results = readiness.results()
        ok = all(problem is None for _, problem in results)
        lines = [f"[+]{name} ok" if problem is None else f"[-]{name} failed: {problem}" for name, problem in results]
        lines.append("readyz check passed" if ok else "readyz check failed")
        return web.Response(status=200 if ok else 503, text="\n".join(lines) + "\n")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def metrics_app(registry: CollectorRegistry, auth: ScrapeAuth, *,
                before: Callable[[], Awaitable[None]] | None = None,
                after: Sequence[Callable[[], bytes]] = ()) -> web.Application:
    """``/metrics`` for a caller ``auth`` allows; serve it over TLS with ``SCRAPE_LIMITS``. ``before`` runs on
    the event loop ahead of each allowed scrape (collectors that read the read model bring it up to date);
    each of ``after`` renders families of its own in the text format, served after the registry's (the
    per-node families, too many series for the library's rendering)."""

    async def metrics(request: web.Request) -> web.Response:
        if request.body_exists:  # never read: refused, and the connection closed rather than drained
            response = web.Response(status=413, text="Request Entity Too Large: a scrape carries no body\n")
            response.force_close()
            return response
        decision = await auth.decide(request.headers.get(hdrs.AUTHORIZATION))
        if not decision.allowed:
            headers = {hdrs.WWW_AUTHENTICATE: 'Bearer realm="cozygpu"'} if decision.status == 401 else None
            return web.Response(status=decision.status, text=decision.message + "\n", headers=headers)
        if before is not None:
            await before()
        # Off the event loop (collectors take locks), and small: what scales with the fleet renders itself.
        body = await asyncio.to_thread(_exposition, registry, after)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get(METRICS_PATH, metrics)
    return app


def _exposition(registry: CollectorRegistry, after: Sequence[Callable[[], bytes]]) -> bytes:
    return b"".join((generate_latest(registry), *(render() for render in after)))


async def serve(endpoints: Sequence[Endpoint], ready: Callable[[], None], *,
                on_bound: Callable[[str, Address], None] | None = None) -> None:
    """Start every endpoint, call ``ready()``, serve until cancelled, then close them all."""
    runners: list[web.AppRunner] = []
    try:
        for endpoint in endpoints:
            limits = attrs.asdict(endpoint.limits) if endpoint.limits is not None else {}
            runner = web.AppRunner(endpoint.app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT, **limits)
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
