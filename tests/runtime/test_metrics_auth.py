"""Who may read ``/metrics``, decided without a cluster: the answers, the cache and its bounds, the counts."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from cozygpu.base.clock import FakeClock
from cozygpu.kube import errors
from cozygpu.runtime.metrics_auth import ALLOW_TTL, DENY_TTL, MAX_REVIEWS_IN_FLIGHT, ScrapeAuth, bearer_token
from tests.runtime.reviewers import FakeReviewer

READER = "system:serviceaccount:cozy-monitoring:prometheus"
NOBODY = "system:serviceaccount:default:nobody"


def auth_with(reviewer: FakeReviewer, **kw: int) -> tuple[ScrapeAuth, FakeClock, CollectorRegistry]:
    clock, registry = FakeClock(), CollectorRegistry()
    return ScrapeAuth(reviewer, registry=registry, clock=clock, **kw), clock, registry


def reviewer() -> FakeReviewer:
    return FakeReviewer({"good": READER, "other": NOBODY}, allowed={READER})


async def test_a_scrape_without_a_token_is_refused_401_without_asking_the_api_server() -> None:
    fake = reviewer()
    auth, _, _ = auth_with(fake)
    decision = await auth.decide(None)
    assert (decision.status, decision.result) == (401, "unauthenticated")
    assert "bearer token" in decision.message
    assert fake.asked == []


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Bearer two words", "Bearer tok\"en",
                                    "Bearer \u00e9t\u00e9", "Token good", "good"])
async def test_a_header_that_is_not_a_bearer_token_is_refused_401_without_asking(header: str) -> None:
    fake = reviewer()
    auth, _, _ = auth_with(fake)
    assert (await auth.decide(header)).status == 401
    assert fake.asked == []


def test_a_bearer_token_is_read_whatever_the_case_of_the_scheme_and_the_spaces_around_it() -> None:
    assert bearer_token("Bearer abc.DEF-_~+/==") == "abc.DEF-_~+/=="
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("BEARER abc") == "abc"


async def test_an_allowed_token_is_reviewed_once_until_its_answer_expires() -> None:
    fake = reviewer()
    auth, clock, _ = auth_with(fake)
    for _ in range(5):
        decision = await auth.decide("Bearer good")
        assert (decision.status, decision.result) == (200, "allowed")
    assert fake.asked == ["token", "access"]
    clock.advance(ALLOW_TTL - 0.1)
    assert (await auth.decide("Bearer good")).allowed
    assert fake.asked == ["token", "access"]
    clock.advance(0.1)
    assert (await auth.decide("Bearer good")).allowed
    assert fake.asked == ["token", "access"] * 2


async def test_a_token_the_api_server_does_not_authenticate_is_refused_401_and_remembered_only_briefly() -> None:
    fake = reviewer()
    auth, clock, _ = auth_with(fake)
    assert (await auth.decide("Bearer forged")).status == 401
    assert (await auth.decide("Bearer forged")).status == 401
    assert fake.asked == ["token"]
    clock.advance(DENY_TTL)
    fake.users["forged"] = READER  # the token became valid (a fresh projection): asked again after the deny TTL
    assert (await auth.decide("Bearer forged")).allowed
    assert fake.asked == ["token", "token", "access"]


async def test_a_user_without_the_right_is_refused_403_naming_the_user_and_the_right() -> None:
    fake = reviewer()
    auth, clock, _ = auth_with(fake)
    decision = await auth.decide("Bearer other")
    assert (decision.status, decision.result) == (403, "forbidden")
    assert f"{NOBODY} may not get /metrics" in decision.message
    assert (await auth.decide("Bearer other")).status == 403
    assert fake.asked == ["token", "access"]
    fake.allowed.add(NOBODY)  # bound to the ClusterRole now: allowed once the denial expires
    clock.advance(DENY_TTL)
    assert (await auth.decide("Bearer other")).allowed


@pytest.mark.parametrize(("failure", "status"), [
    (errors.Unavailable("POST /apis/authentication.k8s.io/v1/tokenreviews: connection refused"), 503),
    (errors.ServerError(500, {"message": "etcd is down"}), 503),
    (errors.TooManyRequests(429, {"message": "slow down"}), 503),
    (errors.Forbidden(403, {"message": "cannot create tokenreviews"}), 500),
])
async def test_an_api_server_that_cannot_answer_is_an_error_never_a_cached_denial(
        failure: errors.KubeError, status: int) -> None:
    fake = reviewer()
    auth, _, _ = auth_with(fake)
    fake.failure = failure
    decision = await auth.decide("Bearer good")
    assert (decision.status, decision.result) == (status, "error")
    assert "review the token" in decision.message or "review of the token" in decision.message
    assert len(auth.cache) == 0
    fake.failure = None
    assert (await auth.decide("Bearer good")).allowed  # at once: nothing was remembered
    assert fake.asked == ["token", "token", "access"]


async def test_a_failure_of_the_access_review_after_the_token_review_is_not_cached_either() -> None:
    fake = reviewer()
    auth, _, _ = auth_with(fake)
    fake.access_failure = errors.Unavailable("POST subjectaccessreviews: timeout")
    assert (await auth.decide("Bearer good")).status == 503
    fake.access_failure = None
    assert (await auth.decide("Bearer good")).allowed
    assert fake.asked == ["token", "access", "token", "access"]


async def test_a_denial_with_an_authorizers_evaluation_error_is_refused_but_asked_again_next_time() -> None:
    fake = reviewer()
    fake.evaluation_error = "webhook authorizer timed out"
    auth, _, _ = auth_with(fake)
    assert (await auth.decide("Bearer other")).status == 403
    assert (await auth.decide("Bearer other")).status == 403
    assert fake.asked == ["token", "access"] * 2


async def test_the_cache_holds_at_most_its_bound_and_drops_the_least_recently_used_first() -> None:
    fake = FakeReviewer({f"t{i}": READER for i in range(4)}, allowed={READER})
    auth, _, _ = auth_with(fake, max_entries=3)
    for token in ("t0", "t1", "t2"):
        await auth.decide(f"Bearer {token}")
    await auth.decide("Bearer t0")  # t0 used again: t1 is now the least recently used
    await auth.decide("Bearer t3")
    assert len(auth.cache) == 3
    asked = len(fake.asked)
    await auth.decide("Bearer t0")
    await auth.decide("Bearer t2")
    await auth.decide("Bearer t3")
    assert len(fake.asked) == asked, "t0, t2 and t3 were kept"
    await auth.decide("Bearer t1")
    assert fake.asked[asked:] == ["token", "access"], "t1 was dropped"


async def test_the_cache_is_keyed_by_the_tokens_digest_never_the_token() -> None:
    token = "eyJhbGciOiJSUzI1NiJ9." + "a" * 800
    fake = FakeReviewer({token: READER}, allowed={READER})
    auth, _, _ = auth_with(fake)
    assert (await auth.decide(f"Bearer {token}")).allowed
    keys = list(auth.cache._entries)
    assert [len(key) for key in keys] == [32]
    assert all(token.encode() not in key for key in keys)


async def test_at_most_a_few_reviews_are_asked_at_once_and_the_rest_wait_for_them() -> None:
    fake = FakeReviewer({f"t{i}": READER for i in range(10)}, allowed={READER})
    fake.gate = asyncio.Event()
    auth, _, _ = auth_with(fake)
    scrapes = [asyncio.create_task(auth.decide(f"Bearer t{i}")) for i in range(10)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert fake.in_flight == MAX_REVIEWS_IN_FLIGHT, "the others wait outside"
    assert not any(scrape.done() for scrape in scrapes)
    fake.gate.set()
    assert all(d.allowed for d in await asyncio.gather(*scrapes))
    assert fake.most_in_flight == MAX_REVIEWS_IN_FLIGHT
    assert fake.asked.count("token") == 10


async def test_every_answer_is_counted_by_result_and_every_review_by_kind() -> None:
    fake = reviewer()
    auth, _, registry = auth_with(fake)
    await auth.decide(None)
    await auth.decide("Bearer forged")
    await auth.decide("Bearer other")
    await auth.decide("Bearer good")
    await auth.decide("Bearer good")
    fake.failure = errors.Unavailable("down")
    await auth.decide("Bearer new")

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("cozygpu_metrics_auth_total", result="unauthenticated") == 2
    assert value("cozygpu_metrics_auth_total", result="forbidden") == 1
    assert value("cozygpu_metrics_auth_total", result="allowed") == 2
    assert value("cozygpu_metrics_auth_total", result="error") == 1
    assert value("cozygpu_metrics_auth_reviews_total", review="token") == 4
    assert value("cozygpu_metrics_auth_reviews_total", review="access") == 2

