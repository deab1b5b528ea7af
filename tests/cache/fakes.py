"""Fakes for the cache's unit tests: a hand-driven clock and a small in-memory API server.

The clock is ``tests.support.clock.FakeClock``. ``FakeApi`` implements what the cache needs of ``cozygpu.kube.Client``
(``list_objects``, ``watch``, ``get``) over an in-memory store with a global
resourceVersion, an event history per collection, paging, and levers a test
pulls: cut every open watch, end them, send bookmarks, expire history (410),
fail the next requests. The real API server is exercised in
``test_cache_controlplane.py``; these fakes make the reflector's rules
deterministic and fast.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson

from cozygpu.kube import errors
from tests.support.clock import FakeClock

__all__ = ["FakeApi", "FakeClock", "until"]

Obj = dict[str, Any]


async def until(predicate: Callable[[], bool], *, turns: int = 2000) -> None:
    """Let the loop run until ``predicate`` holds (bounded by loop turns, not by wall time)."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


class _Stream:
    def __init__(self, path: str, params: Mapping[str, Any]) -> None:
        self.path = path
        self.params = dict(params)
        self.queue: asyncio.Queue[Obj | BaseException | None] = asyncio.Queue()
        self.closed = False


class FakeApi:
    """An in-memory API server for list and watch (see the module docstring)."""

    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self.history: dict[str, list[tuple[int, str, Obj]]] = {}
        #: Watches from a resourceVersion below this get 410 (history compacted).
        self.compacted: dict[str, int] = {}
        self.streams: list[_Stream] = []
        self.list_calls: list[tuple[str, dict[str, Any]]] = []
        self.list_headers: list[dict[str, str]] = []
        self.watch_calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_lists: list[BaseException] = []
        self.fail_watches: list[BaseException] = []
        self._snapshots: dict[tuple[str, int], list[Obj]] = {}
        #: Discovery answers: path -> APIResourceList (missing path: 404).
        self.discovery: dict[str, Obj] = {}

    # -- server-side changes --------------------------------------------------------------

    def _record(self, path: str, type_: str, obj: Obj) -> Obj:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        self.history.setdefault(path, []).append((self.rv, type_, obj))
        for stream in self.streams:
            if stream.path == path and not stream.closed:
                stream.queue.put_nowait({"type": type_, "object": copy.deepcopy(obj)})
        return obj

    def put(self, path: str, obj: Obj) -> Obj:
        """Create or update ``obj`` in the collection ``path``."""
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        store = self.objects.setdefault(path, {})
        type_ = "MODIFIED" if key in store else "ADDED"
        stored = self._record(path, type_, obj)
        store[key] = stored
        return stored

    def remove(self, path: str, namespace: str | None, name: str) -> Obj:
        store = self.objects.setdefault(path, {})
        old = store.pop((namespace or "", name))
        return self._record(path, "DELETED", old)

    def state(self, path: str) -> dict[tuple[str, str], str]:
        """What the server holds: key -> resourceVersion."""
        return {key: obj["metadata"]["resourceVersion"] for key, obj in self.objects.get(path, {}).items()}

    # -- levers ---------------------------------------------------------------------------

    def cut(self) -> None:
        """Every open watch fails as if the connection dropped."""
        for stream in self.streams:
            if not stream.closed:
                stream.queue.put_nowait(errors.Unavailable(f"WATCH {stream.path}: connection reset"))

    def end_watches(self) -> None:
        """Every open watch ends normally (the server's timeoutSeconds)."""
        for stream in self.streams:
            if not stream.closed:
                stream.queue.put_nowait(None)

    def expire_watches(self) -> None:
        """Every open watch gets an ERROR 410 event."""
        for stream in self.streams:
            if not stream.closed:
                stream.queue.put_nowait(errors.Gone(410, {"reason": "Expired", "message": "too old"}))

    def bookmark(self) -> None:
        self.rv += 1
        for stream in self.streams:
            if not stream.closed:
                stream.queue.put_nowait({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.rv)}}})

    def compact(self, path: str) -> None:
        """Forget the history: watches from older resourceVersions now get 410."""
        self.compacted[path] = self.rv

    @property
    def open_watches(self) -> list[_Stream]:
        return [stream for stream in self.streams if not stream.closed]

    # -- the client surface ---------------------------------------------------------------

    async def get(self, path: str, **kw: Any) -> Obj:
        await asyncio.sleep(0)
        if path not in self.discovery:
            raise errors.NotFound(404, {"reason": "NotFound"}, method="GET", path=path)
        return copy.deepcopy(self.discovery[path])

    async def list_objects(self, path: str, *, params: Mapping[str, Any] | None = None, **kw: Any) -> Obj:
        params = dict(params or {})
        self.list_calls.append((path, params))
        self.list_headers.append(dict(kw.get("headers") or {}))
        await asyncio.sleep(0)
        if self.fail_lists:
            raise self.fail_lists.pop(0)
        token = params.get("continue")
        limit = int(params.get("limit") or 0)
        if token:
            snapshot_rv, offset = (int(part) for part in str(token).split(":"))
            if snapshot_rv < self.compacted.get(path, 0):
                raise errors.Gone(410, {"reason": "Expired", "message": "continue token expired"})
            items = self._snapshots[(path, snapshot_rv)]
        else:
            snapshot_rv, offset = self.rv, 0
            items = sorted(self.objects.get(path, {}).values(),
                           key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            self._snapshots[(path, snapshot_rv)] = items
        page = items[offset:offset + limit] if limit else items[offset:]
        meta: Obj = {"resourceVersion": str(snapshot_rv)}
        if limit and offset + limit < len(items):
            meta["continue"] = f"{snapshot_rv}:{offset + limit}"
        result = [copy.deepcopy(obj) for obj in page]
        for obj in result:  # list items carry no kind
            obj.pop("kind", None)
            obj.pop("apiVersion", None)
        return {"kind": "List", "metadata": meta, "items": result}

    async def list_bytes(self, path: str, *, params: Mapping[str, Any] | None = None, **kw: Any) -> bytes:
        """``list_objects``, as the JSON the API server would send (for kinds with a page decoder)."""
        return orjson.dumps(await self.list_objects(path, params=params, **kw))

    def watch(self, path: str, *, params: Mapping[str, Any] | None = None, read_timeout: float = 90.0,
              connect_timeout: float = 10.0) -> AsyncIterator[Obj]:
        return self._watch(path, dict(params or {}))

    async def _watch(self, path: str, params: dict[str, Any]) -> AsyncIterator[Obj]:
        self.watch_calls.append((path, params))
        await asyncio.sleep(0)
        if self.fail_watches:
            raise self.fail_watches.pop(0)
        since = int(params["resourceVersion"])
        if since < self.compacted.get(path, 0):
            raise errors.Gone(410, {"reason": "Expired", "message": f"too old resource version: {since}"})
        stream = _Stream(path, params)
        for rv, type_, obj in self.history.get(path, []):
            if rv > since:
                stream.queue.put_nowait({"type": type_, "object": copy.deepcopy(obj)})
        self.streams.append(stream)
        try:
            while True:
                item = await stream.queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stream.closed = True
