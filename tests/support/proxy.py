"""A loopback HTTP proxy in front of the test API server, for tests that break the connection on purpose.

The proxy listens on plain HTTP on 127.0.0.1 and forwards every request to the
API server over TLS with the identity it was given (a client certificate in
``ssl_context``), streaming answers back as they come, watches included. A
``cozygpu.kube.Client(proxy.url, ssl_context=None)`` talks to it like to the
API server. The test holds the levers:

- ``cut()``: drop every open connection, mid-stream (what a network blip or an
  API server restart does to a watch);
- ``cut_watches()``: drop only the open watch streams; lists and writes in flight
  go on (a load balancer that ends long-lived connections, as some do on a timer);
- ``await block()`` / ``await unblock()``: stop listening, so new connections
  are refused, and listen again on the same port;
- ``expire_next_watches(path, n)``: send the next ``n`` watches of ``path`` upstream from
  resourceVersion 1, which the API server answers with a real 410 Gone for any
  kind whose watch cache started later (a CRD created by the test).

- ``hold_watch_events(path)`` / ``release_watch_events(path)``: watch streams on
  ``path`` (open or opened later) forward nothing while held, then everything
  they buffered, in order: a watch delivered late, as under a loaded API server.

``requests`` logs every request as ``(method, path, query)`` so a test can see
the lists and watches a client made.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import aiohttp
from aiohttp import web

#: Request headers not forwarded (hop-by-hop, or recomputed by the upstream session).
_DROP_REQUEST = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding", "keep-alive"}
#: Response headers not copied back (the proxy re-frames the body).
_DROP_RESPONSE = {"content-length", "transfer-encoding", "content-encoding", "connection", "keep-alive"}


class Proxy:
    """See the module docstring. Use as ``async with Proxy(upstream, ssl_context) as proxy``."""

    def __init__(self, upstream: str, ssl_context: ssl.SSLContext) -> None:
        self.upstream = upstream.rstrip("/")
        self._ssl = ssl_context
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.cuts = 0
        self._expire: dict[str, int] = {}
        #: Watch paths whose events are held: the event is cleared while held.
        self._flowing: dict[str, asyncio.Event] = {}
        #: Every request being served: its downstream transport, and the upstream answer once it came.
        self._open: dict[asyncio.BaseTransport, aiohttp.ClientResponse | None] = {}
        #: The downstream transports of the watches among them.
        self._watching: set[asyncio.BaseTransport] = set()
        self.watch_cuts = 0
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Proxy:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=0), auto_decompress=True,
        )
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await self._listen()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()
        if not self.port:
            server = self._site._server
            assert isinstance(server, asyncio.Server)
            self.port = server.sockets[0].getsockname()[1]

    # -- levers ---------------------------------------------------------------------------

    def cut(self) -> int:
        """Drop every open connection now; returns how many were open."""
        dropped = list(self._open.items())
        self._open.clear()
        for transport, upstream in dropped:
            transport.close()
            if upstream is not None:
                upstream.close()
        self.cuts += len(dropped)
        return len(dropped)

    def cut_watches(self) -> int:
        """Drop every open watch stream now, and nothing else; returns how many were open."""
        dropped = [(t, self._open.pop(t, None)) for t in list(self._watching) if t in self._open]
        self._watching.clear()
        for transport, upstream in dropped:
            transport.close()
            if upstream is not None:
                upstream.close()
        self.watch_cuts += len(dropped)
        return len(dropped)

    async def block(self) -> None:
        """Stop listening (new connections are refused) and drop the open ones."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        self.cut()

    async def unblock(self) -> None:
        if self._site is None:
            await self._listen()

    def expire_next_watches(self, path: str, count: int = 1) -> None:
        """The next ``count`` watches on ``path`` go upstream from resourceVersion 1."""
        self._expire[path] = self._expire.get(path, 0) + count

    def hold_watch_events(self, path: str) -> None:
        """Watch streams on ``path`` forward nothing more until :meth:`release_watch_events`."""
        self._flowing.setdefault(path, asyncio.Event()).clear()

    def release_watch_events(self, path: str) -> None:
        self._flowing.setdefault(path, asyncio.Event()).set()

    @property
    def open_streams(self) -> int:
        return len(self._open)

    def watches(self, path: str) -> list[dict[str, str]]:
        """The query of every watch request on ``path``."""
        return [query for method, where, query in self.requests
                if method == "GET" and where == path and query.get("watch") in ("1", "true")]

    def lists(self, path: str) -> list[dict[str, str]]:
        """The query of every list on ``path`` that started from the first page."""
        return [query for method, where, query in self.requests
                if method == "GET" and where == path and query.get("watch") not in ("1", "true")
                and "continue" not in query]

    # -- forwarding -----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        query = dict(request.query)
        self.requests.append((request.method, request.path, dict(query)))
        if query.get("watch") in ("1", "true") and self._expire.get(request.path, 0) > 0:
            self._expire[request.path] -= 1
            query["resourceVersion"] = "1"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        body = await request.read()
        transport = request.transport
        if transport is None or self._site is None:  # blocked: drop the connection as a refusal would
            if transport is not None:
                transport.close()
            raise web.HTTPServiceUnavailable()
        self._open[transport] = None  # a cut from now on drops this request, answered or not
        if query.get("watch") in ("1", "true"):
            self._watching.add(transport)
        try:
            try:
                upstream = await self._session.request(
                    request.method, self.upstream + request.path, params=query, data=body or None,
                    headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                )
            except aiohttp.ClientError as err:
                raise web.HTTPBadGateway(text=str(err)) from err
            try:
                if transport not in self._open or transport.is_closing():
                    return web.Response(status=502)  # cut while the upstream request was in flight
                self._open[transport] = upstream
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                response.force_close()  # no idle keep-alive connection outlives a block()
                for key, value in upstream.headers.items():
                    if key.lower() not in _DROP_RESPONSE:
                        response.headers.add(key, value)
                await response.prepare(request)
                watch = query.get("watch") in ("1", "true")
                with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                    async for chunk in upstream.content.iter_any():
                        if watch and (flowing := self._flowing.get(request.path)) is not None:
                            await flowing.wait()
                        await response.write(chunk)
                    await response.write_eof()
                return response
            finally:
                upstream.release()
        finally:
            self._open.pop(transport, None)
            self._watching.discard(transport)
