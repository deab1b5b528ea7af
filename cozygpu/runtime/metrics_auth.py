"""Who may read ``/metrics``: a bearer token the API server reviews (R-LEDGER-3, R-RUN-5).

The metrics name tenants, so a scrape must carry ``Authorization: Bearer
<token>`` of someone the cluster allows ``get`` on the non-resource URL
``/metrics``: the server asks the API server with a TokenReview, then a
SubjectAccessReview for the user it names (``cozygpu.kube.reviews``), as
controller-runtime's secure metrics serving does.

Contract of ``ScrapeAuth.decide(authorization)``:
- 401 ``unauthenticated``: no header, not ``Bearer`` with a well-formed token
  (RFC 6750's token characters), or a token the TokenReview does not
  authenticate; 403 ``forbidden``: the SubjectAccessReview does not allow it;
  200 ``allowed``. Each outcome is counted in ``cozygpu_metrics_auth_total``.
- 503 ``error`` when the API server could not answer (no connection, 5xx,
  429), 500 ``error`` when it refused the controller's own review (its RBAC
  lacks ``create`` on the reviews): the caller is told, and the reason is
  logged. Neither is ever cached, so it never reads as a denial later.
- Answers are cached by the SHA-256 of the token: allowed for ``ALLOW_TTL``,
  401 and 403 for ``DENY_TTL``, at most ``MAX_ENTRIES`` tokens (the least
  recently used goes first), so a scrape every few seconds costs the API
  server two calls per ``ALLOW_TTL``, and a revoked right lasts at most that.
  A denial with an authorizer's evaluation error is not cached.
- Cost: the only work that grows with what a caller sends is hashing the
  token, whose length the server bounds (``servers.SCRAPE_LIMITS``); at most
  ``MAX_REVIEWS_IN_FLIGHT`` reviews are asked at once, the rest wait.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import re
from typing import Final, Protocol

import attrs
from prometheus_client import CollectorRegistry, Counter

from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.logging import get_logger
from cozygpu.kube import Client, errors, reviews

_log = get_logger("cozygpu.metrics-auth")

METRICS_PATH: Final = "/metrics"
#: The verb of a GET on a non-resource URL, as the API server's authorizers name it.
VERB: Final = "get"
ALLOW_TTL: Final = 30.0
DENY_TTL: Final = 10.0
MAX_ENTRIES: Final = 256
MAX_REVIEWS_IN_FLIGHT: Final = 4
#: How long one review may take: under Prometheus' default scrape timeout (10 s).
REVIEW_TIMEOUT: Final = 5.0

ALLOWED: Final = "allowed"
UNAUTHENTICATED: Final = "unauthenticated"
FORBIDDEN: Final = "forbidden"
ERROR: Final = "error"
RESULTS: Final = (ALLOWED, UNAUTHENTICATED, FORBIDDEN, ERROR)

#: RFC 6750's b64token: what a bearer token may be made of.
_TOKEN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


@attrs.frozen
class Decision:
    """The answer to one scrape: its HTTP status, the counted result, and a line for the caller."""

    status: int
    result: str
    message: str

    @property
    def allowed(self) -> bool:
        return self.result == ALLOWED


class Reviewer(Protocol):
    """The two questions asked of the API server (a fake in unit tests)."""

    async def token(self, token: str) -> reviews.TokenAnswer: ...

    async def access(self, user: reviews.User) -> reviews.AccessAnswer: ...


class ApiReviewer:
    """The reviews asked of the API server through the controller's own client."""

    def __init__(self, client: Client, *, timeout: float = REVIEW_TIMEOUT) -> None:
        self._client = client
        self._timeout = timeout

    async def token(self, token: str) -> reviews.TokenAnswer:
        return await reviews.review_token(self._client, token, timeout=self._timeout)

    async def access(self, user: reviews.User) -> reviews.AccessAnswer:
        return await reviews.review_access(self._client, user, path=METRICS_PATH, verb=VERB, timeout=self._timeout)


@attrs.frozen
class ScrapeAuthMetrics:
    #: Scrapes answered, by result (``allowed``, ``unauthenticated``, ``forbidden``, ``error``).
    answers: Counter
    #: Reviews asked of the API server, by review (``token``, ``access``): what the cache saves.
    reviews: Counter

    @classmethod
    def on(cls, registry: CollectorRegistry) -> ScrapeAuthMetrics:
        answers = Counter("cozygpu_metrics_auth", "Scrapes of /metrics answered, by result", ("result",),
                          registry=registry)
        asked = Counter("cozygpu_metrics_auth_reviews", "TokenReviews and SubjectAccessReviews asked of the API "
                        "server for /metrics", ("review",), registry=registry)
        for result in RESULTS:
            answers.labels(result)
        for review in ("token", "access"):
            asked.labels(review)
        return cls(answers, asked)


class DecisionCache:
    """Decisions by token digest, each until its own expiry, at most ``max_entries`` (least recently used out)."""

    def __init__(self, clock: Clock, *, max_entries: int = MAX_ENTRIES) -> None:
        self._clock = clock
        self._max = max_entries
        self._entries: collections.OrderedDict[bytes, tuple[float, Decision]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> Decision | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, decision = entry
        if self._clock.now() >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return decision

    def put(self, key: bytes, decision: Decision, ttl: float) -> None:
        self._entries[key] = (self._clock.now() + ttl, decision)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)


_NO_TOKEN: Final = Decision(401, UNAUTHENTICATED, "Unauthorized: send a bearer token (Authorization: Bearer TOKEN) "
                                                  "of someone allowed get on /metrics")
_BAD_TOKEN: Final = Decision(401, UNAUTHENTICATED, "Unauthorized: the Authorization header is not a bearer token")
_NOT_AUTHENTICATED: Final = Decision(401, UNAUTHENTICATED, "Unauthorized: the API server does not accept the token")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None when there is none or it is malformed."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not _TOKEN.fullmatch(token):
        return None
    return token


class ScrapeAuth:
    """Decides each scrape of ``/metrics`` (see the module contract)."""

    def __init__(self, reviewer: Reviewer, *, registry: CollectorRegistry, clock: Clock | None = None,
                 max_entries: int = MAX_ENTRIES, allow_ttl: float = ALLOW_TTL, deny_ttl: float = DENY_TTL) -> None:
        self._reviewer = reviewer
        self.metrics = ScrapeAuthMetrics.on(registry)
        self.cache = DecisionCache(clock if clock is not None else LoopClock(), max_entries=max_entries)
        self._allow_ttl = allow_ttl
        self._deny_ttl = deny_ttl
        self._in_flight = asyncio.Semaphore(MAX_REVIEWS_IN_FLIGHT)

    async def decide(self, authorization: str | None) -> Decision:
        decision = await self._decide(authorization)
        self.metrics.answers.labels(decision.result).inc()
        return decision

    async def _decide(self, authorization: str | None) -> Decision:
        if authorization is None:
            return _NO_TOKEN
        token = bearer_token(authorization)
        if token is None:
            return _BAD_TOKEN
        key = hashlib.sha256(token.encode("ascii")).digest()
        if (cached := self.cache.get(key)) is not None:
            return cached
        async with self._in_flight:
            decision, cacheable = await self._review(token)
        if cacheable:
            self.cache.put(key, decision, self._allow_ttl if decision.allowed else self._deny_ttl)
        return decision

    async def _review(self, token: str) -> tuple[Decision, bool]:
        """The API server's decision on ``token``, and whether it may be cached."""
        try:
            self.metrics.reviews.labels("token").inc()
            who = await self._reviewer.token(token)
            if who.user is None:
                _log.debug("metrics scrape: token not authenticated", error=who.error)
                return _NOT_AUTHENTICATED, True
            self.metrics.reviews.labels("access").inc()
            access = await self._reviewer.access(who.user)
        except errors.KubeError as err:
            return _failed(err), False
        if access.allowed:
            return Decision(200, ALLOWED, "ok"), True
        _log.debug("metrics scrape: access denied", user=who.user.name, reason=access.reason,
                   evaluation_error=access.evaluation_error)
        denied = Decision(403, FORBIDDEN, f"Forbidden: {who.user.name} may not get {METRICS_PATH} "
                                          "(a ClusterRole granting get on the non-resource URL /metrics, bound to it)")
        return denied, not access.evaluation_error


def _failed(err: errors.KubeError) -> Decision:
    """The answer when the API server could not decide: 503 to try again, 500 when it refused the controller."""
    _log.warning("metrics scrape: the API server could not review the token", error=str(err))
    if isinstance(err, errors.Unavailable | errors.ServerError | errors.TooManyRequests):
        return Decision(503, ERROR, "Service Unavailable: the API server could not be asked to review the token; "
                                    "try again")
    status = err.status if isinstance(err, errors.ApiError) else 0
    return Decision(500, ERROR, f"Internal Server Error: the API server refused the controller's review of the token "
                                f"({status}); see the controller's log")
