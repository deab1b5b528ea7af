"""The API boundary against the real API server: watch framing, error mapping."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import aiohttp.web
import pytest

from cozygpu.base.clock import LoopClock
from cozygpu.kube import Client, errors, resource_path
from cozygpu.kube.client import _lines


class ChunkedStream:
    """Feeds bytes in the given chunks, like a socket that splits lines anywhere."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def iter_any(self) -> Any:
        for chunk in self._chunks:
            yield chunk


async def collect(chunks: list[bytes]) -> list[bytes]:
    return [line async for line in _lines(ChunkedStream(chunks), "/x")]  # type: ignore[arg-type]


async def test_watch_lines_are_rejoined_across_chunk_boundaries_and_blank_lines_dropped() -> None:
    assert await collect([b'{"a"', b':1}\n\n{"b":', b"2}\n", b'{"c":3}']) == [b'{"a":1}', b'{"b":2}', b'{"c":3}']


async def test_an_endless_line_is_an_error_of_our_tree_not_a_hang() -> None:
    with pytest.raises(errors.Unavailable, match="exceeds"):
        await collect([b"x" * (5 * 1024 * 1024), b"y" * (5 * 1024 * 1024)])


async def test_a_watched_object_larger_than_aiohttps_line_buffer_arrives_whole(admin: Client, namespace: str) -> None:
    path = resource_path("", "v1", "configmaps", namespace=namespace)
    listed = await admin.list_objects(path)
    big = "g" * (900 * 1024)  # over aiohttp's 512 KiB line limit, under the API server's 1 MiB ConfigMap cap
    seen: list[dict[str, Any]] = []

    async def watch() -> None:
        params = {"resourceVersion": listed["metadata"]["resourceVersion"]}
        async for event in admin.watch(path, params=params):
            seen.append(event)
            return

    async with asyncio.timeout(30), asyncio.TaskGroup() as group:
        group.create_task(watch())
        await admin.create(path, {"metadata": {"name": "big"}, "data": {"blob": big}})
    assert seen[0]["type"] == "ADDED"
    assert seen[0]["object"]["data"]["blob"] == big


async def test_an_unreachable_server_is_unavailable_not_an_aiohttp_error() -> None:
    async with Client("https://127.0.0.1:9", ssl_context=None, default_timeout=2) as client:
        with pytest.raises(errors.Unavailable):
            await client.get("/version", attempts=1)
    assert issubclass(errors.Unavailable, errors.KubeError)
    assert not issubclass(errors.Unavailable, aiohttp.ClientError)


class FlakyServer:
    """A loopback HTTP server that answers each request with the next scripted (status, headers) pair."""

    def __init__(self, script: list[tuple[int, dict[str, str]]]) -> None:
        self.script = script
        self.seen: list[str] = []

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.seen.append(request.method)
        status, headers = self.script.pop(0) if self.script else (200, {})
        body = {"kind": "Status", "code": status, "reason": "TooManyRequests" if status == 429 else "InternalError",
                "message": f"scripted {status}"} if status >= 400 else {"ok": True}
        return aiohttp.web.json_response(body, status=status, headers=headers)


async def serve(script: list[tuple[int, dict[str, str]]]) -> tuple[FlakyServer, aiohttp.web.AppRunner, str]:
    server = FlakyServer(script)
    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.SockSite(runner, socket_bound_to_loopback())
    await site.start()
    return server, runner, f"http://127.0.0.1:{site._sock.getsockname()[1]}"


def socket_bound_to_loopback() -> Any:
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


class RecordingClock(LoopClock):
    """The loop's clock, except that sleeps are recorded and return at once."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


async def test_a_read_is_retried_after_429_and_5xx_honouring_retry_after() -> None:
    server, runner, url = await serve([(429, {"Retry-After": "7"}), (503, {}), (200, {})])
    clock = RecordingClock()
    try:
        async with Client(url, ssl_context=None, clock=clock) as client:
            assert await client.get("/api/v1/namespaces") == {"ok": True}
    finally:
        await runner.cleanup()
    assert server.seen == ["GET", "GET", "GET"]
    assert clock.sleeps[0] == 7.0, "the server's Retry-After, not our own backoff"
    assert 0.2 <= clock.sleeps[1] <= 0.6, "a 5xx waits the backoff's second step (0.4 s), spread over 0.5-1.5x"
    assert len(clock.sleeps) == 2


async def test_a_write_is_retried_after_429_but_never_after_a_5xx_that_may_have_taken_effect() -> None:
    server, runner, url = await serve([(429, {"Retry-After": "0"}), (500, {}), (200, {})])
    try:
        async with Client(url, ssl_context=None, clock=RecordingClock()) as client:
            with pytest.raises(errors.ServerError) as caught:
                await client.merge_patch("/api/v1/namespaces/a/configmaps/b", {"data": {}}, resource_version="7")
    finally:
        await runner.cleanup()
    assert server.seen == ["PATCH", "PATCH"]
    assert caught.value.status == 500
    assert "scripted 500" in str(caught.value)


async def plain_text_server(body: bytes) -> tuple[aiohttp.web.AppRunner, str]:
    async def handle(request: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=body, content_type="application/json")

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.SockSite(runner, socket_bound_to_loopback())
    await site.start()
    return runner, f"http://127.0.0.1:{site._sock.getsockname()[1]}"


async def test_an_answer_that_is_not_json_is_unavailable_not_a_decode_error() -> None:
    runner, url = await plain_text_server(b"<html>a proxy's error page</html>")
    try:
        async with Client(url, ssl_context=None) as client:
            with pytest.raises(errors.Unavailable, match="JSONDecodeError"):
                await client.get("/version", attempts=1)
            with pytest.raises(errors.Unavailable, match="JSONDecodeError"):
                async for _ in client.watch("/api/v1/pods"):
                    pass
    finally:
        await runner.cleanup()


async def test_a_fenced_client_sends_no_write_while_its_fence_says_why_and_reads_all_the_same(
        admin: Client, namespace: str) -> None:
    why: list[str] = ["the term is over"]
    fenced = admin.fenced(lambda: why[0] or None)
    maps = resource_path("", "v1", "configmaps", namespace=namespace)
    with pytest.raises(errors.Fenced, match="the term is over"):
        await fenced.create(maps, {"metadata": {"name": "fenced"}})
    assert await admin.get_or_none(f"{maps}/fenced") is None  # nothing reached the server
    assert (await fenced.list_objects(maps))["items"] == []  # reads go, on the owner's session
    why[0] = ""
    await fenced.create(maps, {"metadata": {"name": "fenced"}})
    await fenced.close()  # a fenced copy closes nothing: the owner's session stays open
    assert (await admin.get(f"{maps}/fenced"))["metadata"]["name"] == "fenced"
