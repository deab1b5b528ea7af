"""The API boundary against the real API server: watch framing, error mapping."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

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
