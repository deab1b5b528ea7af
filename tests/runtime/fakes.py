"""Fake time (``cozygpu.base.clock``) and a fake Lease API for the leader-election unit tests.

``FakeClock`` moves only when a test calls ``advance``; sleeps and timeouts
fire in time order as it passes them. ``FakeLeaseApi`` keeps Lease objects in
memory with the API server's optimistic concurrency (a PUT whose
resourceVersion is stale is a Conflict), and can fail or hang requests on
demand, before or after the write takes effect. Its watch streams one Lease
(``fieldSelector=metadata.name=...``): the current object as ADDED, then every
write through the API (a test that plants an object in ``objects`` is not seen).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

from cozygpu.base.clock import START, FakeClock, settle
from cozygpu.kube import errors
from cozygpu.kube.client import Obj

__all__ = ["START", "FakeClock", "FakeLeaseApi", "settle"]



class FakeLeaseApi:
    """In-memory Leases with resourceVersion preconditions; implements ``leader.LeaseClient``."""

    def __init__(self, *, rng: random.Random | None = None) -> None:
        self.objects: dict[str, Obj] = {}
        self._version = itertools.count(100)
        self.calls: list[tuple[str, str]] = []
        #: Raise Unavailable before anything happens, with this probability.
        self.fail_before = 0.0
        #: Take the write, then raise Unavailable (the caller cannot tell), with this probability.
        self.fail_after = 0.0
        #: Every request waits until cancelled.
        self.hang = False
        #: Every watch fails at once (the hand-over then waits for the retry period).
        self.watch_fails = False
        self._rng = rng if rng is not None else random.Random(0)
        self._watchers: list[tuple[str, asyncio.Queue[Obj]]] = []

    async def _enter(self, verb: str, path: str) -> None:
        self.calls.append((verb, path))
        await asyncio.sleep(0)
        if self.hang:
            await asyncio.Event().wait()
        if self._rng.random() < self.fail_before:
            raise errors.Unavailable(f"{verb} {path}: injected failure")

    def _leave(self, verb: str, path: str) -> None:
        if self._rng.random() < self.fail_after:
            raise errors.Unavailable(f"{verb} {path}: injected failure after the write")

    def _stored(self, path: str, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(next(self._version))
        kind = "MODIFIED" if path in self.objects else "ADDED"
        self.objects[path] = obj
        for watched, events in self._watchers:
            if watched == path:
                events.put_nowait({"type": kind, "object": copy.deepcopy(obj)})
        return copy.deepcopy(obj)

    async def watch(self, path: str, *, params: Mapping[str, str | int | bool] | None = None,
                    **_: Any) -> AsyncIterator[Obj]:
        selector = str((params or {}).get("fieldSelector", ""))
        assert selector.startswith("metadata.name="), f"the fake watches one named object, not {selector!r}"
        watched = f"{path}/{selector.removeprefix('metadata.name=')}"
        await self._enter("WATCH", path)
        if self.watch_fails:
            raise errors.Unavailable(f"WATCH {path}: injected failure")
        events: asyncio.Queue[Obj] = asyncio.Queue()
        entry = (watched, events)
        self._watchers.append(entry)
        try:
            if (current := self.objects.get(watched)) is not None:
                yield {"type": "ADDED", "object": copy.deepcopy(current)}
            while True:
                yield await events.get()
        finally:
            self._watchers.remove(entry)

    async def get_or_none(self, path: str, **_: Any) -> Obj | None:
        await self._enter("GET", path)
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    async def create(self, path: str, body: Obj, **_: Any) -> Obj:
        collection, path = path, f"{path}/{body['metadata']['name']}"
        await self._enter("POST", collection)
        if path in self.objects:
            raise errors.AlreadyExists(409, {"reason": "AlreadyExists"}, method="POST", path=path)
        if body["metadata"].get("resourceVersion"):
            raise errors.BadRequest(400, {"message": "resourceVersion must not be set on create"})
        stored = self._stored(path, body)
        self._leave("POST", collection)
        return stored

    async def replace(self, path: str, body: Obj, **_: Any) -> Obj:
        await self._enter("PUT", path)
        current = self.objects.get(path)
        if current is None:
            raise errors.NotFound(404, {"reason": "NotFound"}, method="PUT", path=path)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise errors.Conflict(409, {"reason": "Conflict"}, method="PUT", path=path)
        stored = self._stored(path, body)
        self._leave("PUT", path)
        return stored

    def spec(self, path: str) -> Obj:
        spec: Obj = self.objects[path]["spec"]
        return spec


class Link:
    """One candidate's connection to a shared ``FakeLeaseApi``; while ``down`` every request fails."""

    def __init__(self, api: FakeLeaseApi) -> None:
        self.api = api
        self.down = False

    def _check(self, verb: str, path: str) -> None:
        if self.down:
            raise errors.Unavailable(f"{verb} {path}: partitioned")

    async def get_or_none(self, path: str, **kw: Any) -> Obj | None:
        self._check("GET", path)
        return await self.api.get_or_none(path, **kw)

    async def create(self, path: str, body: Obj, **kw: Any) -> Obj:
        self._check("POST", path)
        return await self.api.create(path, body, **kw)

    async def replace(self, path: str, body: Obj, **kw: Any) -> Obj:
        self._check("PUT", path)
        return await self.api.replace(path, body, **kw)

    async def watch(self, path: str, **kw: Any) -> AsyncIterator[Obj]:
        self._check("WATCH", path)
        async for event in self.api.watch(path, **kw):
            yield event
