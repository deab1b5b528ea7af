"""Raw JSON requests and watch streams against the Kubernetes API.

Configuration and authentication come from kubernetes-asyncio (kubeconfig,
in-cluster service-account token with refresh); requests go through its
aiohttp session as raw JSON, with no generated model objects on any path (the
models drop unknown fields and decode an order of magnitude slower).

Contract:
- Every request has a timeout (kubernetes-asyncio has none by default).
- Non-2xx answers raise the exception tree of ``errors.py``.
- Reads (GET, list) are retried with backoff on 429, 5xx and a lost
  connection, honouring Retry-After. Writes are retried only on 429, which the
  server sends before doing anything; a write is never repeated after an
  answer that could mean it took effect, so no decision is made twice.
- Writes that decide something pass ``resource_version`` and fail with
  ``Conflict`` when the object changed since it was read.
- ``fenced(fence)`` is the same client (one session) whose writes first ask
  ``fence()``: a reason instead of None refuses the write unsent with
  ``errors.Fenced``. The check runs after the last await before the request
  goes out, so a process frozen mid-pass (a GC pause, SIGSTOP, a suspended
  VM) that wakes past its leader term sends nothing it decided before.
"""

from __future__ import annotations

import copy
import json
import math
import ssl
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar
from urllib.parse import quote

import aiohttp
import orjson
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client import Configuration

from cozygpu.base.backoff import Backoff, Random, new_random
from cozygpu.base.clock import Clock, LoopClock
from cozygpu.kube import errors
from cozygpu.kube.config import load_kubeconfig

JSON: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"

Obj = dict[str, Any]
T = TypeVar("T")


def _json_or_empty(raw: bytes) -> Obj:
    decoded: Obj = orjson.loads(raw) if raw else {}
    return decoded


def resource_path(
    group: str,
    version: str,
    plural: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a collection or an object (core group is ``""``)."""
    parts = ["/api/v1"] if not group else [f"/apis/{group}/{version}"]
    if namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
    if subresource is not None:
        parts.append(subresource)
    return "/".join(parts)


class Client:
    """One connection pool to one API server, for one identity."""

    def __init__(
        self,
        host: str,
        *,
        ssl_context: ssl.SSLContext | None,
        token: str | None = None,
        configuration: Configuration | None = None,
        user_agent: str = "cozygpu",
        default_timeout: float = 30.0,
        clock: Clock | None = None,
        rng: Random | None = None,
    ) -> None:
        self.host = host.rstrip("/")
        #: What retries sleep on (the loop's clock unless a test hands in a fake).
        self._clock: Clock = clock if clock is not None else LoopClock()
        #: What spreads a retry after a 5xx (a seeded one from a test).
        self._rng: Random = rng if rng is not None else new_random()
        self._ssl = ssl_context
        self._token = token
        self._configuration = configuration
        self._headers: list[tuple[str, str]] = [("User-Agent", user_agent), ("Accept", JSON)]
        self.default_timeout = default_timeout
        self._session: aiohttp.ClientSession | None = None
        #: The client whose session a ``fenced`` copy shares (None: this one owns its session).
        self._owner: Client | None = None
        #: Why writes are refused now, or None when they may go (see ``fenced``).
        self._fence: Callable[[], str | None] | None = None

    def fenced(self, fence: Callable[[], str | None]) -> Client:
        """This client, sharing its session, whose writes are refused unsent while ``fence()`` gives a reason."""
        clone = copy.copy(self)
        clone._owner = self._owner or self
        clone._session = None
        clone._fence = fence
        return clone

    # -- construction ---------------------------------------------------------------------

    @classmethod
    async def from_kubeconfig(cls, path: str | None = None, *, context: str | None = None, **kw: Any) -> Client:
        """From ``path``, else ``$KUBECONFIG``, else ``~/.kube/config``; a bad one raises ``ConfigError``."""
        cfg = Configuration()
        source = await load_kubeconfig(path, context=context, configuration=cfg)
        return cls._from_configuration(cfg, where=source.describe(), **kw)

    @classmethod
    def in_cluster(cls, **kw: Any) -> Client:
        cfg = Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException as err:
            raise errors.ConfigError(f"in-cluster configuration (no --kubeconfig given): {err}") from None
        return cls._from_configuration(cfg, where="in-cluster configuration", **kw)

    @classmethod
    async def auto(cls, kubeconfig: str | None, **kw: Any) -> Client:
        """From ``kubeconfig`` when given, else in-cluster."""
        if kubeconfig:
            return await cls.from_kubeconfig(kubeconfig, **kw)
        return cls.in_cluster(**kw)

    @classmethod
    def _from_configuration(cls, cfg: Configuration, *, where: str, **kw: Any) -> Client:
        try:
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            if cfg.cert_file:
                context.load_cert_chain(cfg.cert_file, keyfile=cfg.key_file)
        except (ssl.SSLError, OSError) as err:
            raise errors.ConfigError(f"{where}: its certificates cannot be loaded ({err})") from None
        if not cfg.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return cls(str(cfg.host), ssl_context=context, configuration=cfg, **kw)

    # -- plumbing -------------------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        if self._owner is not None:
            return self._owner._get_session()
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False, limit=64)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._owner is not None:
            return  # the owner's session: closed with the owner
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _auth_headers(self) -> list[tuple[str, str]]:
        if self._token:
            return [("Authorization", f"Bearer {self._token}")]
        if self._configuration is not None:
            key = await self._configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
            if key:
                return [("Authorization", str(key))]
        return []

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool] | Sequence[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
        attempts: int = 5,
        headers: Mapping[str, str] | None = None,
    ) -> Obj:
        """Send one request and return the decoded JSON answer (see the module contract)."""
        return await self._send(method, path, _json_or_empty, params=params, body=body, content_type=content_type,
                                timeout=timeout, attempts=attempts, headers=headers)

    async def request_bytes(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | bool] | Sequence[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
        attempts: int = 5,
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """``request``, but the answer's body undecoded, for a caller that decodes it its own way."""
        return await self._send(method, path, bytes, params=params, body=body, content_type=content_type,
                                timeout=timeout, attempts=attempts, headers=headers)

    async def _send(
        self,
        method: str,
        path: str,
        parse: Callable[[bytes], T],
        *,
        params: Mapping[str, str | int | bool] | Sequence[tuple[str, str]] | None,
        body: Any,
        content_type: str,
        timeout: float | None,
        attempts: int,
        headers: Mapping[str, str] | None,
    ) -> T:
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        query = _query(params)
        is_read = method == "GET"
        # The schedule (0.2 s doubling to 5 s) is base's Backoff without jitter; a 5xx spreads it
        # over 0.5-1.5x, a 429 without Retry-After waits it as is.
        backoff = Backoff(self._clock, initial=0.2, cap=5.0, jitter=0.0, reset_after=math.inf)
        for attempt in range(1, attempts + 1):
            try:
                return await self._once(method, path, query, data, content_type, timeout, headers, parse)
            except errors.TooManyRequests as err:
                if attempt == attempts:
                    raise
                delay = backoff.next_delay()
                await self._clock.sleep(err.retry_after if err.retry_after is not None else delay)
            except (errors.ServerError, errors.Unavailable):
                if not is_read or attempt == attempts:
                    raise
                await self._clock.sleep(backoff.next_delay() * (0.5 + self._rng.random()))
        raise AssertionError("unreachable")

    async def _once(
        self, method: str, path: str, query: list[tuple[str, str]], data: str | None,
        content_type: str, timeout: float | None, extra_headers: Mapping[str, str] | None,
        parse: Callable[[bytes], T],
    ) -> T:
        budget = aiohttp.ClientTimeout(total=timeout if timeout is not None else self.default_timeout)
        try:
            headers = [*self._headers, *await self._auth_headers()]
            if extra_headers:
                overridden = {key.lower() for key in extra_headers}
                headers = [(k, v) for k, v in headers if k.lower() not in overridden] + list(extra_headers.items())
            if data is not None:
                headers.append(("Content-Type", content_type))
            if self._fence is not None and method != "GET" and (why := self._fence()) is not None:
                raise errors.Fenced(why, method=method, path=path)
            async with self._get_session().request(
                method, self.host + path, params=query, data=data, headers=headers, timeout=budget
            ) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise _api_error(resp, raw.decode("utf-8", "replace"), method, path)
                return parse(raw)
        except errors.KubeError:
            raise
        except _TRANSPORT_ERRORS as err:
            raise errors.Unavailable(f"{method} {path}: {type(err).__name__}: {err}") from err

    # -- verbs ----------------------------------------------------------------------------

    async def get(self, path: str, **kw: Any) -> Obj:
        return await self.request("GET", path, **kw)

    async def get_or_none(self, path: str, **kw: Any) -> Obj | None:
        try:
            return await self.get(path, **kw)
        except errors.NotFound:
            return None

    async def list_objects(self, path: str, *, params: Mapping[str, str | int | bool] | None = None, **kw: Any) -> Obj:
        return await self.request("GET", path, params=params, **kw)

    async def list_bytes(self, path: str, *, params: Mapping[str, str | int | bool] | None = None,
                         **kw: Any) -> bytes:
        """A list page's JSON undecoded (the cache decodes some kinds into only the fields it keeps)."""
        return await self.request_bytes("GET", path, params=params, **kw)

    async def create(self, path: str, body: Obj, *, dry_run: bool = False, **kw: Any) -> Obj:
        params = {"dryRun": "All"} if dry_run else None
        return await self.request("POST", path, body=body, params=params, **kw)

    async def replace(self, path: str, body: Obj, **kw: Any) -> Obj:
        """PUT the whole object; its metadata.resourceVersion is the precondition."""
        return await self.request("PUT", path, body=body, **kw)

    async def merge_patch(self, path: str, patch: Obj, *, resource_version: str | None = None, **kw: Any) -> Obj:
        """RFC 7386 merge patch, optionally preconditioned on ``resource_version``."""
        if resource_version is not None:
            patch = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": resource_version}}
        return await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH, **kw)

    async def json_patch(self, path: str, ops: list[Obj], *, resource_version: str | None = None,
                         **kw: Any) -> Obj:
        """RFC 6902 JSON patch; ``resource_version`` makes it conditional (``Conflict`` when stale).

        The precondition is written into the patched object's resourceVersion,
        which the server compares with the stored one; a ``test`` op would
        fail as 422 Invalid instead, indistinguishable from a bad patch.
        """
        if resource_version is not None:
            ops = [{"op": "add", "path": "/metadata/resourceVersion", "value": resource_version}, *ops]
        return await self.request("PATCH", path, body=ops, content_type=JSON_PATCH, **kw)

    async def apply(self, path: str, body: Obj, *, field_manager: str, force: bool = True, **kw: Any) -> Obj:
        params = {"fieldManager": field_manager, "force": "true" if force else "false"}
        return await self.request("PATCH", path, body=body, content_type=APPLY_PATCH, params=params, **kw)

    async def delete(self, path: str, *, resource_version: str | None = None, uid: str | None = None,
                     grace_period_seconds: int | None = None, **kw: Any) -> Obj:
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        pre = {k: v for k, v in (("resourceVersion", resource_version), ("uid", uid)) if v}
        if pre:
            body["preconditions"] = pre
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        return await self.request("DELETE", path, body=body, **kw)

    async def watch(
        self,
        path: str,
        *,
        params: Mapping[str, str | int | bool] | None = None,
        read_timeout: float = 90.0,
        connect_timeout: float = 10.0,
    ) -> AsyncIterator[Obj]:
        """Yield raw watch events (``{"type": ..., "object": {...}}``) until the server ends the stream.

        ``read_timeout`` is the inactivity limit: the server sends a bookmark about
        every minute when asked for them, so a longer silence means a dead stream.
        A 410 arrives either as an HTTP error (raised as ``Gone``) or as an ERROR
        event carrying a Status with code 410, which is raised as ``Gone`` too.
        """
        query = _query({**(params or {}), "watch": "1"})
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        try:
            headers = [*self._headers, *await self._auth_headers()]
            async with self._get_session().get(
                self.host + path, params=query, headers=headers, timeout=timeout
            ) as resp:
                if resp.status >= 400:
                    raise _api_error(resp, await resp.text(), "WATCH", path)
                async for line in _lines(resp.content, path):
                    event: Obj = orjson.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise errors.error_for(int(status.get("code") or 500), status, method="WATCH", path=path)
                    yield event
        except errors.KubeError:
            raise
        except _TRANSPORT_ERRORS as err:
            raise errors.Unavailable(f"WATCH {path}: {type(err).__name__}: {err}") from err


#: What the transport can raise: aiohttp's errors (connection, payload, a malformed
#: response), timeouts, OS errors, an answer that is not JSON (ValueError), and
#: whatever the credential refresh raises (kubernetes-asyncio's ConfigException
#: is an Exception). All become ``Unavailable``: the call did not get an answer.
_TRANSPORT_ERRORS: Final = (aiohttp.ClientError, TimeoutError, OSError, ValueError)

#: The longest watch event line accepted. etcd stores objects up to about 1.5 MiB and
#: JSON framing adds little; anything longer is a broken stream, not an object.
MAX_EVENT_BYTES: Final = 8 * 1024 * 1024


async def _lines(stream: aiohttp.StreamReader, path: str) -> AsyncIterator[bytes]:
    """Split a watch body into non-empty lines of any length up to ``MAX_EVENT_BYTES``.

    aiohttp's own line iterator caps a line at its read buffer (far below the
    largest object the API server stores) and raises an error outside our
    exception tree, so a large VMI would wedge its informer.
    """
    pending = bytearray()
    async for chunk in stream.iter_any():
        pending += chunk
        start = 0
        while (end := pending.find(b"\n", start)) != -1:
            if end > start:
                yield bytes(pending[start:end])
            start = end + 1
        del pending[:start]
        if len(pending) > MAX_EVENT_BYTES:
            raise errors.Unavailable(f"WATCH {path}: an event line exceeds {MAX_EVENT_BYTES} bytes")
    if pending.strip():
        yield bytes(pending)


def _query(params: Mapping[str, str | int | bool] | Sequence[tuple[str, str]] | None) -> list[tuple[str, str]]:
    if params is None:
        return []
    items = params.items() if isinstance(params, Mapping) else params
    out: list[tuple[str, str]] = []
    for key, value in items:
        if isinstance(value, bool):
            value = "true" if value else "false"
        out.append((key, str(value)))
    return out


def _api_error(resp: aiohttp.ClientResponse, text: str, method: str, path: str) -> errors.ApiError:
    try:
        body = json.loads(text) if text else None
    except ValueError:
        body = {"message": text[:2000]}
    if not isinstance(body, dict):
        body = {"message": str(body)}
    retry_after: float | None = None
    if "Retry-After" in resp.headers:
        try:
            retry_after = float(resp.headers["Retry-After"])
        except ValueError:
            retry_after = None
    return errors.error_for(resp.status, body, method=method, path=path, retry_after=retry_after)
