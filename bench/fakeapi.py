"""An in-memory API server at the client boundary, for in-process benches of the cache and the binder.

``FakeApi`` is a ``cozygpu.kube.Client`` whose requests never leave the
process: LIST pages and WATCH streams served from dicts (one global
resourceVersion, an event history per collection so a watch started after a
list misses nothing), API discovery of the core group, and the writes the
binder sends — merge patches (of an object or its ``status``, with a
``resourceVersion`` precondition that fails with ``Conflict``), creates and
deletes — each echoed to the open watches of its collection as an event with a
new resourceVersion, as the API server does. Core ``Event`` objects are
counted, not kept: nothing watches them.

Writes answer without yielding to the event loop, so a pass that writes is
not interleaved with the folding of its own echoes: they wait in the
streams' queues until the pass awaits something else. Every event a watch
delivered is timed (``folds``): from the moment the stream hands it to the
reflector to the moment the reflector asks for the next one — the reflector
does nothing else in between (transform, freeze, store, indexes, handlers,
triggers) but, once per few ms of buffered events, let the loop go once, so
that is the cost of folding it. A fold is recorded when the reflector asks
for the next event, which may come after the cache already shows the event:
``folded()`` waits for every handed event's record.

Only what the cache and the binder use is here: field selectors on
``metadata.name``; no label selectors, no bookmarks, no compaction, no
server-side apply.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from cozygpu.kube import Client, errors

Obj = dict[str, Any]
Key = tuple[str, str]
#: Where every stored object's creationTimestamp points (the bench's objects are older than its clock).
CREATED = "2026-12-01T10:00:00Z"


def _copy(obj: Obj) -> Obj:
    """A deep copy, as a decoded answer would be (the real client decodes JSON too)."""
    copied: Obj = orjson.loads(orjson.dumps(obj))
    return copied


def merge(target: Obj, patch: Mapping[str, Any]) -> None:
    """RFC 7386 in place: maps merge key by key, None removes, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        elif isinstance(value, Mapping):
            fresh: Obj = {}
            merge(fresh, value)
            target[key] = fresh
        else:
            target[key] = _copy({"v": value})["v"]


def parse(path: str) -> tuple[str, str, str, str]:
    """``(collection, namespace, name, subresource)`` of a REST path; the collection is its cluster-wide path."""
    if path.startswith("/api/v1/"):
        prefix, rest = "/api/v1", path[len("/api/v1/"):]
    elif path.startswith("/apis/"):
        group, version, rest = path[len("/apis/"):].split("/", 2)
        prefix = f"/apis/{group}/{version}"
    else:
        raise ValueError(f"not a resource path: {path}")
    parts = rest.split("/")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) >= 3:
        namespace, parts = parts[1], parts[2:]
    plural = parts[0]
    name = parts[1] if len(parts) > 1 else ""
    sub = parts[2] if len(parts) > 2 else ""
    return f"{prefix}/{plural}", namespace, name, sub


def _name_selector(params: Mapping[str, Any]) -> str | None:
    selector = str(params.get("fieldSelector") or "")
    if not selector:
        return None
    field, _, value = selector.partition("=")
    if field != "metadata.name":
        raise ValueError(f"field selector not supported by the fake: {selector}")
    return value


class _Stream:
    def __init__(self, collection: str, name: str | None) -> None:
        self.collection = collection
        self.name = name
        self.queue: asyncio.Queue[Obj] = asyncio.Queue()


class FakeApi(Client):
    """An in-memory API server behind the client's own methods (see the module docstring)."""

    def __init__(self, *, core: Mapping[str, bool] | None = None) -> None:
        super().__init__("https://fake.invalid", ssl_context=None)
        self.rv = 1000
        self.objects: dict[str, dict[Key, Obj]] = {}
        self.history: dict[str, list[tuple[int, Obj]]] = {}
        #: The resourceVersion of the last event of each collection.
        self.latest: dict[str, int] = {}
        self.streams: list[_Stream] = []
        #: Core resources discovery lists: plural -> namespaced.
        self.core = dict(core or {})
        #: Seconds each delivered watch event took the reflector to fold, with its collection.
        self.folds: list[tuple[str, float]] = []
        self._unfolded = 0
        self._all_folded = asyncio.Event()
        self._all_folded.set()
        #: Writes taken, by verb and collection (``"PATCH /api/v1/nodes"``).
        self.writes: dict[str, int] = {}
        self.events_created = 0

    # -- the server's side ----------------------------------------------------------------

    def _next(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, collection: str, type_: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.latest[collection] = rv
        event = {"type": type_, "object": obj}
        self.history.setdefault(collection, []).append((rv, event))
        for stream in self.streams:
            if stream.collection == collection and (stream.name is None or stream.name == obj["metadata"]["name"]):
                stream.queue.put_nowait(_copy(event))

    def load(self, collection: str, objects: list[Obj]) -> None:
        """Store ``objects`` as they are (before anything lists them: no events)."""
        store = self.objects.setdefault(collection, {})
        for obj in objects:
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = self._next()
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("generation", 1)
            meta.setdefault("creationTimestamp", CREATED)
            store[(meta.get("namespace") or "", meta["name"])] = obj

    def get_object(self, path: str) -> Obj:
        collection, namespace, name, _ = parse(path)
        found = self.objects.get(collection, {}).get((namespace, name))
        if found is None:
            raise errors.NotFound(404, {"reason": "NotFound", "message": f"{path} not found"}, method="GET", path=path)
        return found

    def _count(self, verb: str, collection: str) -> None:
        key = f"{verb} {collection}"
        self.writes[key] = self.writes.get(key, 0) + 1

    # -- reads --------------------------------------------------------------------------------

    async def get(self, path: str, **kw: Any) -> Obj:
        if path == "/api/v1":
            resources = [{"name": plural, "namespaced": namespaced} for plural, namespaced in self.core.items()]
            return {"kind": "APIResourceList", "groupVersion": "v1", "resources": resources}
        if path.startswith("/apis/") and path.count("/") == 3:  # a group's discovery: none is served here
            raise errors.NotFound(404, {"reason": "NotFound", "message": f"{path} not found"}, method="GET", path=path)
        return _copy(self.get_object(path))

    async def list_objects(self, path: str, *, params: Mapping[str, str | int | bool] | None = None,
                           **kw: Any) -> Obj:
        collection, namespace, _, _ = parse(path)
        params = params or {}
        name = _name_selector(params)
        items = [obj for (ns, n), obj in sorted(self.objects.get(collection, {}).items())
                 if (not namespace or ns == namespace) and (name is None or n == name)]
        # One page holds everything: a consistent read, as the real list's pages are.
        page = [_copy(obj) for obj in items]
        for obj in page:
            obj.pop("kind", None)
            obj.pop("apiVersion", None)
        return {"kind": "List", "metadata": {"resourceVersion": str(self.rv)}, "items": page}

    async def list_bytes(self, path: str, *, params: Mapping[str, str | int | bool] | None = None,
                         **kw: Any) -> bytes:
        return orjson.dumps(await self.list_objects(path, params=params))

    async def watch(self, path: str, *, params: Mapping[str, str | int | bool] | None = None,
                    read_timeout: float = 90.0, connect_timeout: float = 10.0) -> AsyncIterator[Obj]:
        collection, _, _, _ = parse(path)
        params = params or {}
        since = int(params.get("resourceVersion") or 0)
        stream = _Stream(collection, _name_selector(params))
        for rv, event in self.history.get(collection, []):
            if rv > since and (stream.name is None or stream.name == event["object"]["metadata"]["name"]):
                stream.queue.put_nowait(_copy(event))
        self.streams.append(stream)
        try:
            while True:
                event = await stream.queue.get()
                handed = time.perf_counter()
                self._unfolded += 1
                self._all_folded.clear()
                try:
                    yield event
                finally:
                    self._unfolded -= 1
                    if not self._unfolded:
                        self._all_folded.set()
                # The reflector asks for the next event right after folding this one.
                self.folds.append((collection, time.perf_counter() - handed))
        finally:
            self.streams.remove(stream)

    async def folded(self) -> None:
        """Until every event a stream handed out has been folded (its fold is in ``folds``)."""
        await self._all_folded.wait()

    # -- writes -------------------------------------------------------------------------------

    async def create(self, path: str, body: Obj, *, dry_run: bool = False, **kw: Any) -> Obj:
        return self.create_now(path, body)

    def create_now(self, path: str, body: Obj) -> Obj:
        collection, namespace, _, _ = parse(path)
        obj = _copy(body)
        meta = obj.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
        self._count("POST", collection)
        if collection == "/api/v1/events":
            self.events_created += 1
            meta["resourceVersion"] = self._next()
            return obj
        key = (meta.get("namespace") or "", meta["name"])
        store = self.objects.setdefault(collection, {})
        if key in store:
            raise errors.AlreadyExists(409, {"reason": "AlreadyExists", "message": f"{key} exists"},
                                       method="POST", path=path)
        meta.update(resourceVersion=self._next(), uid=str(uuid.uuid4()), generation=1,
                    creationTimestamp=meta.get("creationTimestamp") or CREATED)
        store[key] = obj
        self._emit(collection, "ADDED", _copy(obj))
        return _copy(obj)

    async def merge_patch(self, path: str, patch: Obj, *, resource_version: str | None = None, **kw: Any) -> Obj:
        return self.patch_now(path, patch, resource_version=resource_version)

    def patch_now(self, path: str, patch: Mapping[str, Any], *, resource_version: str | None = None) -> Obj:
        """A merge patch of the object at ``path`` (``.../status``: of its status only), echoed as MODIFIED."""
        collection, _, _, sub = parse(path)
        obj = self.get_object(path)
        meta = obj["metadata"]
        wanted = resource_version or (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and str(wanted) != meta["resourceVersion"]:
            raise errors.Conflict(409, {"reason": "Conflict", "message": f"{path}: the object has been modified"},
                                  method="PATCH", path=path)
        self._count("PATCH", collection)
        if sub == "status":
            merge(obj, {"status": patch.get("status") or {}})
        else:
            body = {k: v for k, v in patch.items() if k != "status"}
            body["metadata"] = {k: v for k, v in (patch.get("metadata") or {}).items() if k != "resourceVersion"}
            if "spec" in body:
                meta["generation"] = int(meta.get("generation") or 1) + 1
            merge(obj, body)
        meta["resourceVersion"] = self._next()
        self._emit(collection, "MODIFIED", _copy(obj))
        return _copy(obj)

    async def delete(self, path: str, *, resource_version: str | None = None, uid: str | None = None,
                     grace_period_seconds: int | None = None, **kw: Any) -> Obj:
        return self.delete_now(path, resource_version=resource_version)

    def delete_now(self, path: str, *, resource_version: str | None = None) -> Obj:
        """A delete: DELETED, or MODIFIED with a deletionTimestamp while finalizers remain."""
        collection, namespace, name, _ = parse(path)
        obj = self.get_object(path)
        meta = obj["metadata"]
        if resource_version and resource_version != meta["resourceVersion"]:
            raise errors.Conflict(409, {"reason": "Conflict", "message": f"{path}: precondition failed"},
                                  method="DELETE", path=path)
        self._count("DELETE", collection)
        meta["resourceVersion"] = self._next()
        if meta.get("finalizers"):
            meta.setdefault("deletionTimestamp", CREATED)
            self._emit(collection, "MODIFIED", _copy(obj))
        else:
            del self.objects[collection][(namespace, name)]
            self._emit(collection, "DELETED", _copy(obj))
        return _copy(obj)

    async def replace(self, path: str, body: Obj, **kw: Any) -> Obj:
        raise NotImplementedError("the fake API takes merge patches, creates and deletes")

    async def json_patch(self, path: str, ops: list[Obj], *, resource_version: str | None = None,
                         **kw: Any) -> Obj:
        raise NotImplementedError("the fake API takes merge patches, creates and deletes")

    async def apply(self, path: str, body: Obj, *, field_manager: str, force: bool = True, **kw: Any) -> Obj:
        raise NotImplementedError("the fake API takes merge patches, creates and deletes")
