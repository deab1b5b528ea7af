"""The loopback balancer (kube-proxy's part on the local plane) against small backends of its own.

Each backend is a TCP server that answers every line with its name, and a
readiness endpoint the test turns to 200, 503, refused or silent. Probes run
every 50 ms here (1 s on the plane), so each test takes well under a second;
every wait is on the balancer's own change callback, bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cozygpu.devcluster.balancer import Backend, Balancer, probe

PERIOD = TIMEOUT = 0.05
WAIT = 10.0


class FakeReplica:
    """A named TCP server and its readiness endpoint, whose answer the test sets."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.readiness = "ok"  # ok | unready | silent
        self.server: asyncio.Server | None = None
        self.health: asyncio.Server | None = None
        self.port = 0
        self.health_port = 0
        self.clients: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        if self.health is None:
            self.health = await asyncio.start_server(self._ready, "127.0.0.1", 0)
            self.health_port = self.health.sockets[0].getsockname()[1]

    async def stop_serving(self) -> None:
        """As a killed replica: its port refuses connections (those open are closed)."""
        assert self.server is not None
        self.server.close()
        for writer in self.clients:
            writer.close()

    def backend(self) -> Backend:
        return Backend(self.name, "127.0.0.1", self.port, f"http://127.0.0.1:{self.health_port}/readyz")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients.add(writer)
        with contextlib.suppress(OSError):
            while await reader.readline():
                writer.write(f"{self.name}\n".encode())
                await writer.drain()
        writer.close()
        self.clients.discard(writer)

    async def _ready(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if self.readiness == "silent":
            await asyncio.sleep(10 * TIMEOUT)
        else:
            status = "200 OK" if self.readiness == "ok" else "503 Service Unavailable"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n".encode())
        writer.close()

    async def close(self) -> None:
        for server in (self.server, self.health):
            if server is not None:
                server.close()
        for writer in self.clients:
            writer.close()


class Watched:
    """The balancer's states as it reports them, awaitable."""

    def __init__(self) -> None:
        self.changed = asyncio.Condition()
        self.state: dict[str, Any] = {}

    def on_change(self, state: dict[str, Any]) -> None:
        self.state = state
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def ready(self) -> set[str]:
        return {e["name"] for e in self.state.get("endpoints", []) if e["ready"]}

    async def until(self, check: Callable[[], bool], what: str) -> None:
        try:
            async with asyncio.timeout(WAIT), self.changed:
                await self.changed.wait_for(check)
        except TimeoutError:
            raise AssertionError(f"{what}: not within {WAIT:g}s (state {self.state})") from None


@contextlib.asynccontextmanager
async def balancing(*names: str) -> AsyncIterator[tuple[Balancer, dict[str, FakeReplica], Watched]]:
    replicas = {name: FakeReplica(name) for name in names}
    for replica in replicas.values():
        await replica.start()
    watched = Watched()
    balancer = Balancer([r.backend() for r in replicas.values()], period=PERIOD, timeout=TIMEOUT,
                        on_change=watched.on_change)
    try:
        async with balancer.running():
            await watched.until(lambda: watched.ready() == set(names), "every backend joining")
            yield balancer, replicas, watched
    finally:
        for replica in replicas.values():
            await replica.close()


async def ask(balancer: Balancer) -> str:
    """One connection through the balancer: which backend answers ("" when the connection is closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", balancer.port)
    try:
        writer.write(b"who\n")
        await writer.drain()
        async with asyncio.timeout(WAIT):
            return (await reader.readline()).decode().strip()
    except OSError:
        return ""
    finally:
        writer.close()


async def test_connections_go_to_every_ready_backend_in_turn() -> None:
    async with balancing("a", "b") as (balancer, _, _):
        answers = [await ask(balancer) for _ in range(6)]
    assert sorted(answers) == ["a", "a", "a", "b", "b", "b"]


async def test_a_backend_failing_readiness_leaves_its_open_connections_closed_and_comes_back_after_two_passes(
) -> None:
    async with balancing("a", "b") as (balancer, replicas, watched):
        # An open connection through each backend, as the API server's keep-alive connections.
        held = {}
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", balancer.port)
            writer.write(b"who\n")
            held[(await reader.readline()).decode().strip()] = (reader, writer)
        assert set(held) == {"a", "b"}
        replicas["a"].readiness = "unready"
        await watched.until(lambda: watched.ready() == {"b"}, "a leaving")
        left = next(e for e in watched.state["events"] if e["endpoint"] == "a" and not e["ready"])
        assert left["why"] == "answered HTTP/1.1 503 Service Unavailable"
        async with asyncio.timeout(WAIT):
            assert await held["a"][0].read() == b"", "the connection through a is closed"
        held["b"][1].write(b"who\n")
        assert (await held["b"][0].readline()).decode().strip() == "b", "the one through b is untouched"
        assert {await ask(balancer) for _ in range(4)} == {"b"}
        replicas["a"].readiness = "ok"
        await watched.until(lambda: watched.ready() == {"a", "b"}, "a coming back")
        back = [e for e in watched.state["events"] if e["endpoint"] == "a"]
        assert [e["ready"] for e in back] == [True, False, True]
        assert back[2]["at"] - back[1]["at"] >= PERIOD, "two passes in a row, one period apart at least"
        assert {await ask(balancer) for _ in range(4)} == {"a", "b"}
        for _, writer in held.values():
            writer.close()


async def test_a_silent_backend_leaves_on_its_probe_timeout() -> None:
    async with balancing("a", "b") as (balancer, replicas, watched):
        replicas["b"].readiness = "silent"  # as a frozen process: the connection opens, no answer comes
        await watched.until(lambda: watched.ready() == {"a"}, "b leaving")
        assert watched.state["endpoints"][1]["lastProbe"] == f"no answer within {TIMEOUT:g}s"
        assert {await ask(balancer) for _ in range(4)} == {"a"}


async def test_a_backend_that_refuses_connections_costs_no_connection_even_before_its_probe_fails() -> None:
    async with balancing("a", "b") as (balancer, replicas, watched):
        await replicas["a"].stop_serving()  # killed: its port refuses, its readiness has not failed yet
        assert watched.ready() == {"a", "b"}
        assert [await ask(balancer) for _ in range(4)] == ["b"] * 4
        assert balancer.rejected == 0


async def test_with_no_ready_backend_a_connection_is_closed_at_once() -> None:
    async with balancing("a") as (balancer, replicas, watched):
        replicas["a"].readiness = "unready"
        await watched.until(lambda: watched.ready() == set(), "a leaving")
        assert await ask(balancer) == ""
        assert balancer.rejected == 1


@pytest.mark.parametrize(("answer", "expected"), [
    ("HTTP/1.1 200 OK\r\n\r\n", (True, "200")),
    ("HTTP/1.1 503 Service Unavailable\r\n\r\n", (False, "answered HTTP/1.1 503 Service Unavailable")),
    ("", (False, "answered nothing")),
])
async def test_the_probe_passes_only_on_200(answer: str, expected: tuple[bool, str]) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        assert request.startswith(b"GET /readyz HTTP/1.1\r\n")
        writer.write(answer.encode())
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        assert await probe(f"http://127.0.0.1:{port}/readyz", 1.0) == expected
    server.close()
    passed, why = await probe(f"http://127.0.0.1:{port}/readyz", 1.0)
    assert not passed
    assert why.startswith("refused")
