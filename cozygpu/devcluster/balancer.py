"""A TCP balancer on loopback in front of the controller replicas: the local plane's kube-proxy.

In a cluster the webhooks call the chart's Service, and kube-proxy sends each
connection to a pod that passes its readiness probe. Kubernetes refuses
loopback addresses as endpoints, so the local plane cannot use a Service:
this balancer plays both parts on one loopback address.

- **Endpoints.** Each ``Backend`` is a replica's TCP address (its webhook
  server) and its readiness URL (``/readyz``). Every ``period`` (1 s) the
  balancer probes each one: an HTTP GET that must answer 200 within
  ``timeout`` (1 s); refused, any other status or no answer is a failure. A
  backend starts outside the endpoints and joins on its first pass; it leaves
  after ``failure_threshold`` (2) failures in a row, so a replica that is
  killed or frozen is gone within about ``period × failure_threshold +
  timeout`` (2–3 s); once it has left, it comes back after
  ``success_threshold`` (2) passes in a row (kubelet's default is 1; two keep
  out a replica that answers once on its way to ending, such as a frozen
  leader that is continued and finds its term over).
- **Connections.** Each accepted connection goes to a ready endpoint, taken
  in turn (kube-proxy in iptables mode picks at random); bytes are copied both
  ways untouched, so TLS passes through and the replicas' serving certificate
  must be valid for the balancer's address. When an endpoint refuses the
  connection the next ready one is tried (nothing of the client's has been
  sent yet), so a killed replica costs no new connection even before its
  probe fails. With no ready endpoint the connection is closed at once, as a
  Service without endpoints rejects it.
- **Leaving closes.** When an endpoint leaves, the connections open through
  it are closed both ways. kube-proxy leaves established TCP flows alone; the
  API server then keeps reusing its idle keep-alive connections to a frozen
  pod until each call times out. Closing them makes every call after the
  endpoint left open a new connection, to a ready replica.

Every change of the endpoints is logged, and handed to ``on_change`` with
the balancer's ``state()``, as is every change of a probe's answer (the
replicas' supervisor writes it to ``DIR/replicas.state.json``; times are
``time.monotonic()``, which is one clock for every process of the host, so a
test can compare them with its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

import attrs

from cozygpu.base.logging import get_logger

log = get_logger("cozygpu.devcluster.balancer")

PERIOD: Final = 1.0
TIMEOUT: Final = 1.0
FAILURE_THRESHOLD: Final = 2
SUCCESS_THRESHOLD: Final = 2
#: How long a connection to an endpoint may take before the next one is tried.
CONNECT_TIMEOUT: Final = 1.0
#: Endpoint changes kept in ``state()["events"]``.
EVENTS_KEPT: Final = 200
CHUNK: Final = 64 * 1024


@attrs.frozen
class Backend:
    """One replica behind the balancer: where its connections go and where its readiness is asked."""

    name: str
    host: str
    port: int
    ready_url: str


@attrs.define(eq=False)
class _Endpoint:
    backend: Backend
    ready: bool = False
    failures: int = 0
    passes: int = 0
    #: When ``ready`` last changed (or the balancer started), on ``time.monotonic()``.
    since: float = 0.0
    last_probe: str = "not probed yet"
    #: When the probe's answer last changed (``time.monotonic()``, when that probe ended).
    last_probe_at: float = 0.0
    joined_before: bool = False
    connections: set[asyncio.StreamWriter] = attrs.field(factory=set)


class Balancer:
    """See the module docstring. ``async with balancer.running():`` listens and probes until the block ends."""

    def __init__(self, backends: Sequence[Backend], *, host: str = "127.0.0.1", port: int = 0,
                 period: float = PERIOD, timeout: float = TIMEOUT, failure_threshold: int = FAILURE_THRESHOLD,
                 success_threshold: int = SUCCESS_THRESHOLD,
                 on_change: Callable[[dict[str, Any]], None] | None = None) -> None:
        if not backends:
            raise ValueError("a balancer needs at least one backend")
        self.host = host
        self.port = port
        self.period = period
        self.timeout = timeout
        self.failure_threshold = failure_threshold
        self.success_threshold = success_threshold
        self._on_change = on_change
        started = time.monotonic()
        self._endpoints = [_Endpoint(backend, since=started) for backend in backends]
        self._turn = itertools.count()
        self._events: list[dict[str, Any]] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        #: Connections accepted, and those closed at once for want of a ready endpoint.
        self.accepted = 0
        self.rejected = 0

    # -- what others read -----------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def ready(self) -> list[str]:
        return [e.backend.name for e in self._endpoints if e.ready]

    def state(self) -> dict[str, Any]:
        """The endpoints now and every change so far (the last ``EVENTS_KEPT``), JSON-ready."""
        return {
            "address": self.address,
            "endpoints": [{"name": e.backend.name, "address": f"{e.backend.host}:{e.backend.port}",
                           "ready": e.ready, "since": e.since, "lastProbe": e.last_probe,
                           "lastProbeAt": e.last_probe_at,
                           "connections": len(e.connections)} for e in self._endpoints],
            "events": list(self._events),
            "accepted": self.accepted,
            "rejected": self.rejected,
        }

    # -- running --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Balancer]:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("balancing", address=self.address,
                 backends=", ".join(f"{e.backend.name}={e.backend.host}:{e.backend.port}" for e in self._endpoints))
        self._changed()
        try:
            async with asyncio.TaskGroup() as group:
                probes = [group.create_task(self._probe_loop(e), name=f"probe {e.backend.name}")
                          for e in self._endpoints]
                try:
                    yield self
                finally:
                    for task in probes:
                        task.cancel()
        finally:
            self._server.close()
            for endpoint in self._endpoints:
                self._close_all(endpoint)
            for handler in list(self._handlers):
                handler.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()

    async def _probe_loop(self, endpoint: _Endpoint) -> None:
        while True:
            began = time.monotonic()
            passed, what = await probe(endpoint.backend.ready_url, self.timeout)
            self._record(endpoint, passed, what)
            await asyncio.sleep(max(0.0, self.period - (time.monotonic() - began)))

    def _record(self, endpoint: _Endpoint, passed: bool, what: str) -> None:
        answer_changed = what != endpoint.last_probe
        if answer_changed:
            endpoint.last_probe, endpoint.last_probe_at = what, time.monotonic()
        was = endpoint.ready
        if passed:
            endpoint.failures = 0
            endpoint.passes += 1
            needed = self.success_threshold if endpoint.joined_before else 1
            if not endpoint.ready and endpoint.passes >= needed:
                self._set(endpoint, True, what)
        else:
            endpoint.passes = 0
            endpoint.failures += 1
            if endpoint.ready and endpoint.failures >= self.failure_threshold:
                self._set(endpoint, False, what)
        if answer_changed and endpoint.ready == was:  # a change of answer alone is reported too
            self._changed()

    def _set(self, endpoint: _Endpoint, ready: bool, why: str) -> None:
        endpoint.ready = ready
        endpoint.since = time.monotonic()
        if ready:
            endpoint.joined_before = True
        else:
            self._close_all(endpoint)
        self._events.append({"at": endpoint.since, "endpoint": endpoint.backend.name, "ready": ready, "why": why})
        del self._events[:-EVENTS_KEPT]
        log.info("endpoint joined" if ready else "endpoint left", endpoint=endpoint.backend.name, probe=why,
                 ready=", ".join(self.ready()) or "none")
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.state())

    def _close_all(self, endpoint: _Endpoint) -> None:
        for writer in list(endpoint.connections):
            writer.close()
        endpoint.connections.clear()

    # -- connections ----------------------------------------------------------------------

    def _order(self) -> list[_Endpoint]:
        """The ready endpoints, starting with the one whose turn it is."""
        ready = [e for e in self._endpoints if e.ready]
        if not ready:
            return []
        start = next(self._turn) % len(ready)
        return ready[start:] + ready[:start]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._forward(reader, writer)
        except asyncio.CancelledError:
            writer.close()  # the balancer stops: the end of this connection, not an error to report
        finally:
            self._handlers.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        upstream: tuple[_Endpoint, asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for endpoint in self._order():
            backend = endpoint.backend
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT):
                    up_reader, up_writer = await asyncio.open_connection(backend.host, backend.port)
            except (OSError, TimeoutError) as err:
                log.debug("endpoint refused a connection; trying the next", endpoint=backend.name,
                          error=str(err) or type(err).__name__)
                continue
            if not endpoint.ready:  # it left while we connected
                up_writer.close()
                continue
            upstream = (endpoint, up_reader, up_writer)
            break
        if upstream is None:
            self.rejected += 1
            writer.close()
            return
        endpoint, up_reader, up_writer = upstream
        endpoint.connections.update((writer, up_writer))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_pipe(reader, up_writer))
                group.create_task(_pipe(up_reader, writer))
        finally:
            endpoint.connections.discard(writer)
            endpoint.connections.discard(up_writer)
            for w in (writer, up_writer):
                w.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until either side ends; then close ``sink`` (the other pipe sees its source end and stops too)."""
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        sink.close()


async def probe(url: str, timeout: float) -> tuple[bool, str]:
    """One readiness probe as kubelet makes it: GET ``url`` (plain HTTP), 200 within ``timeout`` passes."""
    rest = url.removeprefix("http://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            status_line = (await reader.readline()).decode(errors="replace").strip()
    except TimeoutError:
        return False, f"no answer within {timeout:g}s"
    except OSError as err:
        return False, f"refused: {err.strerror or err}"
    finally:
        if writer is not None:
            writer.close()
    parts = status_line.split(" ", 2)
    if len(parts) >= 2 and parts[1] == "200":
        return True, "200"
    return False, f"answered {status_line or 'nothing'}"
