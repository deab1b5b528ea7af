"""The AdmissionReview envelope the three webhooks share (issue 11 §1, R-ADM-6).

Contract:
- In: a POST whose content type is ``application/json`` and whose body (at
  most ``MAX_BODY`` bytes) is an ``admission.k8s.io/v1`` AdmissionReview with
  a ``request.uid``. Anything else is answered 400 with a reason (the API
  server then applies ``failurePolicy: Fail``): garbage is never allowed.
- Out: an AdmissionReview v1 echoing ``request.uid``, ``allowed``, a
  ``status`` with the refusal's message (code 403 for a refusal, 500 for a
  crash) and, when the handler mutates, a base64 JSON patch.
- A handler that raises is a refusal with a message naming the webhook and
  the error, never a 500 page with a traceback (fail closed).
- Every call runs under ``deadline`` seconds (below the webhook's
  ``timeoutSeconds``): a handler still running then is cancelled and the
  request refused with a message saying so. A handler that must undo its
  writes does so inside its own deadline (the VMI webhook's bind wait ends
  earlier than this one).
- Bounded (issue 22, ``bounds``): before the body is parsed its JSON
  containers and commas are counted, a slice at a time; past
  ``MAX_JSON_ITEMS``, or nested past orjson's 1024 levels, it is refused
  unparsed, with an AdmissionReview when the request's UID can be read where
  the API server writes it, else a 400. A UID longer than ``MAX_UID`` is a
  400. A message is cut to ``MAX_MESSAGE`` characters.
- Metrics: answers by webhook, outcome and refusal reason (a bounded set), and a latency histogram per webhook.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import orjson
from aiohttp import web

from cozygpu.admission import bounds
from cozygpu.admission.metrics import (
    REASON_BAD_REQUEST,
    REASON_INTERNAL_ERROR,
    REASON_NOT_READY,
    AdmissionMetrics,
    metric_reason,
)
from cozygpu.api import admission
from cozygpu.api.admission import API_VERSION, KIND, AdmissionRequest
from cozygpu.base.logging import get_logger
from cozygpu.model import refusals
from cozygpu.model.refusals import Reason, Refusal

_log = get_logger("cozygpu.admission")

#: The largest AdmissionReview read (the API server's own request limit is 3 MiB; a review carries two objects).
MAX_BODY: Final = 7 * 1024 * 1024

ALLOWED: Final = "allowed"
REFUSED: Final = "refused"
ERROR: Final = "error"
BAD_REQUEST: Final = "bad-request"


class BadReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer."""


class TooDeep(BadReview):
    """The body is JSON nested past the parser's limit; the message is the parser's."""


#: The request a handler reads: decoded once, by the API floor.
Request = AdmissionRequest


@attrs.frozen(kw_only=True)
class Verdict:
    """A handler's answer: allowed with an optional JSON patch, or refused with a message.

    A refusal of the request is a ``Refusal`` of ``model/refusals.py``
    (:meth:`refuse`): its reason and message are built there, never here
    (``tests/model/test_refusal_home.py``). The two answers that are not the
    request's refusal but this replica's state, :meth:`not_ready` and
    :meth:`internal_error`, carry reasons of their own that are no ``Reason``.
    """

    allowed: bool
    message: str = ""
    reason: str = ""
    patch: Sequence[Mapping[str, Any]] = ()

    @classmethod
    def allow(cls, patch: Sequence[Mapping[str, Any]] = (), message: str = "") -> Verdict:
        return cls(allowed=True, patch=tuple(patch), message=message)

    @classmethod
    def refuse(cls, refusal: Refusal) -> Verdict:
        return cls(allowed=False, message=refusal.message, reason=str(refusal.reason))

    @classmethod
    def not_ready(cls, problem: str) -> Verdict:
        """This replica cannot decide yet (its cache has not synced): another try, or replica, may."""
        return cls(allowed=False, message=f"GPU admission is not ready on this replica: {problem}",
                   reason=REASON_NOT_READY)

    @classmethod
    def internal_error(cls, message: str) -> Verdict:
        """The handler crashed or overran its deadline: refused (fail closed), with what went wrong."""
        return cls(allowed=False, message=message, reason=REASON_INTERNAL_ERROR)


Handler = Callable[[Request], Awaitable[Verdict]]


def parse_review(body: bytes) -> Request:
    """The request of an AdmissionReview v1, or ``BadReview`` saying what is wrong."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        if "depth limit" in str(error):
            raise TooDeep(str(error)) from None
        raise BadReview(f"the body is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise BadReview("the body is not a JSON object")
    head = admission.review(parsed)
    if not head.is_v1:
        raise BadReview(f"expected {KIND} {API_VERSION}, got {bounds.describe(head.kind)} "
                        f"{bounds.describe(head.api_version)}")
    if head.request is None:
        raise BadReview("the AdmissionReview has no request")
    uid = admission.request_uid(head.request)
    if not uid:
        raise BadReview("the AdmissionReview request has no uid")
    if len(uid) > bounds.MAX_UID:
        raise BadReview(f"the AdmissionReview request.uid is {len(uid)} characters, at most {bounds.MAX_UID}")
    if admission.request_object(head.request) is None:
        raise BadReview("the AdmissionReview request has no object")
    return admission.admission_request(head.request)


def readable(message: str) -> str:
    """``message`` cut to ``MAX_MESSAGE``, unprintable characters escaped: a refusal quotes what it was sent."""
    message = bounds.clip(message, bounds.MAX_MESSAGE)
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in message)


def review_answer(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview v1 response for ``verdict``."""
    if not verdict.allowed:
        return admission.response(uid, allowed=False, code=403, reason=verdict.reason or str(Reason.REFUSED),
                                  message=readable(verdict.message))
    patch = base64.b64encode(orjson.dumps(list(verdict.patch))).decode() if verdict.patch else ""
    return admission.response(uid, allowed=True, warning=readable(verdict.message) if verdict.message else "",
                              patch=patch)


def _bad(message: str) -> tuple[int, bytes, str, str]:
    return 400, orjson.dumps({"error": readable(message)}), BAD_REQUEST, REASON_BAD_REQUEST


def _unparsed(body: bytes, refusal: Refusal) -> tuple[int, bytes, str, str]:
    """A refusal of a body that is not parsed: an AdmissionReview when its UID can be read, else a 400."""
    uid = bounds.request_uid(body)
    if not uid:
        return _bad(refusal.message)
    verdict = Verdict.refuse(refusal)
    return 200, orjson.dumps(review_answer(uid, verdict)), REFUSED, metric_reason(verdict.reason, allowed=False)


async def respond(name: str, handler: Handler, *, method: str, content_type: str, body: bytes, deadline: float
                  ) -> tuple[int, bytes, str, str]:
    """(HTTP status, body, outcome, metric reason) for one call: 400 for what is not an AdmissionReview, else 200."""
    if method != "POST":
        return _bad(f"{name}: admission reviews are POSTed, not {method}")
    if content_type != "application/json":
        return _bad(f"{name}: content type {bounds.clip(content_type)!r} is not application/json")
    if len(body) > MAX_BODY:
        return _bad(f"{name}: body of {len(body)} bytes exceeds {MAX_BODY}")
    items = await bounds.json_items(body)
    if items > bounds.MAX_JSON_ITEMS:
        return _unparsed(body, refusals.over_limit(
            f"{name}: AdmissionReview", "JSON containers and commas in the body (counted before parsing)",
            limit=bounds.MAX_JSON_ITEMS, found=items, unit="or more"))
    try:
        request = parse_review(body)
    except TooDeep as error:
        return _unparsed(body, refusals.json_too_deep(name, limit=bounds.MAX_JSON_DEPTH, problem=str(error)))
    except BadReview as error:
        return _bad(f"{name}: {error}")
    verdict = await answer(name, handler, request, deadline=deadline)
    outcome = ALLOWED if verdict.allowed else (ERROR if verdict.reason == REASON_INTERNAL_ERROR else REFUSED)
    reason = metric_reason(verdict.reason or str(Reason.REFUSED), allowed=verdict.allowed)
    return 200, orjson.dumps(review_answer(request.uid, verdict)), outcome, reason


def endpoint(name: str, handler: Handler, *, deadline: float, metrics: AdmissionMetrics | None = None
             ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of one webhook: the envelope around ``handler`` (see the module contract)."""

    async def serve(http: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        outcome, reason = BAD_REQUEST, REASON_BAD_REQUEST
        try:
            if http.content_length is not None and http.content_length > MAX_BODY:
                status, body, outcome, reason = _bad(f"{name}: body of {http.content_length} bytes exceeds {MAX_BODY}")
            else:
                try:
                    raw = await http.read() if http.method == "POST" else b""  # capped at the app's client_max_size
                except web.HTTPRequestEntityTooLarge:
                    status, body, outcome, reason = _bad(f"{name}: body exceeds {MAX_BODY} bytes")
                else:
                    status, body, outcome, reason = await respond(
                        name, handler, method=http.method, content_type=http.content_type, body=raw,
                        deadline=deadline)
            return web.Response(status=status, body=body, content_type="application/json")
        finally:
            if metrics is not None:
                metrics.answers.labels(name, outcome, reason).inc()
                metrics.latency.labels(name).observe(time.perf_counter() - started)

    return serve


async def answer(name: str, handler: Handler, request: Request, *, deadline: float) -> Verdict:
    """``handler``'s verdict on ``request`` within ``deadline`` seconds; a crash or overrun is a refusal."""
    try:
        async with asyncio.timeout(deadline):
            return await handler(request)
    except TimeoutError:
        _log.error("admission handler overran its deadline", webhook=name, uid=request.uid, deadline=deadline)
        return Verdict.internal_error(f"{name}: no answer within {deadline:g} s; nothing was admitted")
    except Exception as error:  # fail closed: a crash refuses, with what went wrong
        _log.exception("admission handler failed", webhook=name, uid=request.uid)
        return Verdict.internal_error(f"{name}: internal error ({type(error).__name__}: {error}); nothing was "
                                      "admitted")
