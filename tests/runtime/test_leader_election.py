"""Leader election on a fake clock and an in-memory Lease API (client-go's algorithm, ReleaseOnCancel)."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import pytest
from prometheus_client import CollectorRegistry

from cozygpu.api.times import micro_time
from cozygpu.kube.client import resource_path
from cozygpu.runtime.leader import ElectionConfig, LeaderElector, LeadershipLost
from cozygpu.runtime.metrics import LeaderMetrics
from tests.runtime.fakes import FakeClock, FakeLeaseApi, Link, settle

NAMESPACE = "cozy-gpu"
LEASE = resource_path("coordination.k8s.io", "v1", "leases", namespace=NAMESPACE, name="cozygpu-leader")
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 15.0, 10.0, 2.0
#: The longest a candidate waits between tries: the period plus client-go's 1.2 jitter.
MAX_RETRY_WAIT = RETRY_PERIOD * 2.2


class Work:
    """Leader work that records when each term's work ran, on the fake clock."""

    def __init__(self, clock: FakeClock, api: FakeLeaseApi | None = None, *, fail_after: float | None = None) -> None:
        self.clock = clock
        self.api = api
        self.fail_after = fail_after
        self.starts: list[float] = []
        self.intervals: list[tuple[float, float]] = []
        self.running = False

    async def __call__(self) -> None:
        start = self.clock.now()
        self.starts.append(start)
        self.running = True
        try:
            if self.fail_after is not None:
                await self.clock.sleep(self.fail_after)
                raise RuntimeError("leader work broke")
            await asyncio.Event().wait()
        finally:
            self.running = False
            self.intervals.append((start, self.clock.now()))
            if self.api is not None:
                self.api.calls.append(("WORK-STOPPED", ""))


class Guard:
    """A ``TermGuard`` on the fake clock: when it would end the process, and whether it is armed."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.deadline: float | None = None
        self.armed_at: list[float] = []

    def arm(self, seconds: float, reason: str) -> None:
        self.deadline = self.clock.now() + seconds
        self.armed_at.append(self.clock.now())

    def disarm(self) -> None:
        self.deadline = None


def make_elector(api: FakeLeaseApi | Link, clock: FakeClock, identity: str, *,
                 registry: CollectorRegistry | None = None, guard: Guard | None = None) -> LeaderElector:
    config = ElectionConfig(namespace=NAMESPACE, name="cozygpu-leader", identity=identity,
                            lease_duration=LEASE_DURATION, renew_deadline=RENEW_DEADLINE, retry_period=RETRY_PERIOD)
    metrics = LeaderMetrics.on(registry) if registry is not None else None
    return LeaderElector(api, config, clock=clock, rng=random.Random(identity), metrics=metrics, guard=guard)


@asynccontextmanager
async def campaigning(elector: LeaderElector, work: Work) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(elector.run(work))
    try:
        yield task
    finally:
        task.cancel()
        await settle()
        # Releasing may retry on the fake clock: keep time moving until the elector is done.
        while not task.done():
            await work.clock.run_for(0.5)
        with suppress(asyncio.CancelledError, LeadershipLost):
            await task


def ghost_lease(holder: str, *, renew_time: str, transitions: int = 3) -> dict[str, object]:
    return {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "cozygpu-leader", "namespace": NAMESPACE, "resourceVersion": "1"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": renew_time,
                 "renewTime": renew_time, "leaseTransitions": transitions},
    }


async def test_a_candidate_creates_the_missing_lease_and_leads() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    work = Work(clock)
    async with campaigning(make_elector(api, clock, "a"), work):
        await clock.run_for(0.1)
        assert work.running
        spec = api.spec(LEASE)
        assert spec["holderIdentity"] == "a"
        assert spec["leaseDurationSeconds"] == 15
        assert spec["leaseTransitions"] == 0
        assert spec["acquireTime"] == spec["renewTime"] == micro_time(clock.wall() - dt.timedelta(seconds=0.1))


async def test_renewals_keep_acquire_time_and_transitions_and_move_renew_time() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    async with campaigning(make_elector(api, clock, "a"), Work(clock)):
        await clock.run_for(0.1)
        first = dict(api.spec(LEASE))
        await clock.run_for(7)
        later = api.spec(LEASE)
        assert later["acquireTime"] == first["acquireTime"]
        assert later["leaseTransitions"] == first["leaseTransitions"]
        assert later["renewTime"] > first["renewTime"]


async def test_a_second_candidate_never_leads_while_the_leader_renews() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    a_work, b_work = Work(clock), Work(clock)
    async with campaigning(make_elector(api, clock, "a"), a_work):
        await clock.run_for(0.1)
        async with campaigning(make_elector(api, clock, "b"), b_work):
            await clock.run_for(10 * LEASE_DURATION)
            assert a_work.running
            assert b_work.intervals == []
            assert not b_work.running


async def test_a_lease_that_stops_changing_is_taken_one_lease_duration_after_it_was_first_seen() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    # The remote renewTime is in the future: only the local observation time may count.
    api.objects[LEASE] = ghost_lease("ghost", renew_time="2030-01-01T00:00:00.000000Z", transitions=3)
    work = Work(clock)
    async with campaigning(make_elector(api, clock, "b"), work):
        await clock.run_for(LEASE_DURATION - 0.01)
        assert not work.running
        await clock.run_for(MAX_RETRY_WAIT + 0.02)
        assert work.running
    spec = api.spec(LEASE)
    assert spec["leaseTransitions"] == 4


async def test_a_lease_with_an_old_remote_renew_time_is_still_waited_for() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    api.objects[LEASE] = ghost_lease("ghost", renew_time="2020-01-01T00:00:00.000000Z")
    work = Work(clock)
    async with campaigning(make_elector(api, clock, "b"), work):
        await clock.run_for(LEASE_DURATION - 0.01)
        assert not work.running


async def test_a_changing_lease_restarts_the_wait() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    api.objects[LEASE] = ghost_lease("ghost", renew_time="2026-12-02T12:00:00.000000Z")
    work = Work(clock)
    async with campaigning(make_elector(api, clock, "b"), work):
        await clock.run_for(10)
        renewed = ghost_lease("ghost", renew_time="2026-12-02T12:00:10.000000Z")
        renewed["metadata"]["resourceVersion"] = "2"  # type: ignore[index]
        api.objects[LEASE] = renewed
        await clock.run_for(LEASE_DURATION - 0.5)
        assert not work.running
        await clock.run_for(MAX_RETRY_WAIT + RETRY_PERIOD)
        assert work.running


async def test_leader_work_is_cancelled_when_no_renewal_succeeds_within_the_renew_deadline() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    work = Work(clock)
    async with campaigning(make_elector(api, clock, "a"), work):
        await clock.run_for(0.1)
        api.fail_before = 1.0
        await clock.run_for(LEASE_DURATION * 2)
        assert not work.running
        (start, stop), = work.intervals
        # Counted from when the last successful write was sent (t=0), not from the first failure.
        assert stop == pytest.approx(start + RENEW_DEADLINE)
        assert stop < start + LEASE_DURATION


async def test_a_hung_renewal_request_is_cut_off_at_the_renew_deadline() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    work = Work(clock)
    async with campaigning(make_elector(api, clock, "a"), work):
        await clock.run_for(0.1)
        api.hang = True
        await clock.run_for(LEASE_DURATION)
        (start, stop), = work.intervals
        assert stop == pytest.approx(start + RENEW_DEADLINE)


async def test_leader_work_stops_at_once_when_a_renewal_finds_another_holder() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    work = Work(clock)
    async with campaigning(make_elector(api, clock, "a"), work):
        await clock.run_for(0.1)
        intruder = ghost_lease("intruder", renew_time=micro_time(clock.wall()))
        intruder["metadata"]["resourceVersion"] = "9999"  # type: ignore[index]
        api.objects[LEASE] = intruder
        await clock.run_for(RETRY_PERIOD)
        assert not work.running
        (_, stop), = work.intervals
        assert stop == pytest.approx(RETRY_PERIOD)  # the first renewal after the change, not the deadline
        # The intruder's lease is not "released" by the process that lost it.
        assert api.spec(LEASE)["holderIdentity"] == "intruder"


async def test_stopping_the_leader_stops_its_work_then_releases_the_lease() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    work = Work(clock, api)
    async with campaigning(make_elector(api, clock, "a"), work):
        await clock.run_for(5)
    spec = api.spec(LEASE)
    assert spec["holderIdentity"] == ""
    assert spec["leaseDurationSeconds"] == 1
    assert spec["leaseTransitions"] == 0
    assert spec["renewTime"] == spec["acquireTime"] == micro_time(clock.wall())
    last_put = max(i for i, (verb, _) in enumerate(api.calls) if verb == "PUT")
    assert api.calls.index(("WORK-STOPPED", "")) < last_put


async def test_a_candidate_stopped_after_a_write_it_could_not_confirm_releases_the_lease() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    api.fail_after = 1.0  # every write lands, and every caller hears an error
    work = Work(clock)
    async with campaigning(make_elector(api, clock, "a"), work):
        await clock.run_for(0.1)
        assert api.spec(LEASE)["holderIdentity"] == "a"
        assert not work.running
        api.fail_after = 0.0
    assert api.spec(LEASE)["holderIdentity"] == ""


async def test_a_candidate_that_never_wrote_does_not_touch_the_lease_when_stopped() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    api.objects[LEASE] = ghost_lease("ghost", renew_time="2026-12-02T12:00:00.000000Z")
    async with campaigning(make_elector(api, clock, "b"), Work(clock)):
        await clock.run_for(5)
    assert {verb for verb, _ in api.calls} == {"GET", "WATCH"}
    assert api.spec(LEASE)["holderIdentity"] == "ghost"


async def hand_over(api: FakeLeaseApi, clock: FakeClock, *, wait: float) -> tuple[Work, float]:
    """a leads, b campaigns, a stops; after ``wait`` more seconds: b's work and when a had stopped."""
    a_work, b_work = Work(clock), Work(clock)
    a_task = asyncio.create_task(make_elector(api, clock, "a").run(a_work))
    await clock.run_for(0.1)
    async with campaigning(make_elector(api, clock, "b"), b_work):
        await clock.run_for(3)
        assert a_work.running
        assert not b_work.running
        a_task.cancel()
        with suppress(asyncio.CancelledError):
            await a_task
        stopped = clock.now()
        await clock.run_for(wait)
    assert api.spec(LEASE)["leaseTransitions"] == 1
    return b_work, stopped


async def test_a_released_lease_is_taken_by_the_watching_candidate_at_once() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    b_work, stopped = await hand_over(api, clock, wait=0)
    assert b_work.starts == [stopped], "b waited for its retry period instead of the release it watched"


async def test_without_its_watch_a_candidate_takes_a_released_lease_on_its_next_try() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    api.watch_fails = True
    b_work, stopped = await hand_over(api, clock, wait=MAX_RETRY_WAIT + 0.01)
    assert len(b_work.starts) == 1
    assert 0 < b_work.starts[0] - stopped <= MAX_RETRY_WAIT


async def test_each_change_of_holder_counts_one_transition() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    for identity in ("a", "b", "a"):
        async with campaigning(make_elector(api, clock, identity), Work(clock)):
            await clock.run_for(RETRY_PERIOD * 3)
    assert api.spec(LEASE)["leaseTransitions"] == 2


async def test_lease_times_are_written_in_utc_whatever_the_clock_zone() -> None:
    eastern = dt.timezone(dt.timedelta(hours=5))
    clock, api = FakeClock(wall_start=dt.datetime(2026, 12, 2, 15, 0, 0, tzinfo=eastern)), FakeLeaseApi()
    async with campaigning(make_elector(api, clock, "a"), Work(clock)):
        await clock.run_for(0.25)
        assert api.spec(LEASE)["renewTime"] == "2026-12-02T10:00:00.000000Z"


def test_a_naive_time_is_refused_rather_than_guessed() -> None:
    with pytest.raises(ValueError, match="naive"):
        micro_time(dt.datetime(2026, 12, 2, 12, 0, 0))


async def test_leader_work_that_raises_ends_the_term_releases_the_lease_and_propagates() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    task = asyncio.create_task(make_elector(api, clock, "a").run(Work(clock, fail_after=3)))
    await clock.run_for(3.5)
    assert task.done()
    with pytest.raises(ExceptionGroup) as caught:
        task.result()
    assert caught.group_contains(RuntimeError, match="leader work broke")
    assert api.spec(LEASE)["holderIdentity"] == ""


async def test_a_process_that_lost_the_lease_never_campaigns_again() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    work = Work(clock)
    task = asyncio.create_task(make_elector(api, clock, "a").run(work))
    await clock.run_for(0.1)
    api.fail_before = 1.0
    await clock.run_for(RENEW_DEADLINE + 1)
    assert not work.running
    await clock.run_for(RENEW_DEADLINE)  # trying to release, bounded by the renew deadline
    assert task.done()
    with pytest.raises(LeadershipLost, match="renew deadline"):
        task.result()
    api.fail_before = 0.0
    calls = len(api.calls)
    await clock.run_for(LEASE_DURATION * 3)
    assert len(work.starts) == 1
    assert len(api.calls) == calls


async def test_the_guard_ends_a_term_at_the_lease_end_which_each_renewal_moves_on() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    guard = Guard(clock)
    async with campaigning(make_elector(api, clock, "a", guard=guard), Work(clock)):
        await clock.run_for(0.1)
        assert guard.deadline == pytest.approx(LEASE_DURATION)  # acquired at t=0
        await clock.run_for(RETRY_PERIOD * 3)
        assert guard.deadline == pytest.approx(RETRY_PERIOD * 3 + LEASE_DURATION)  # renewed at 3 x retry
    assert guard.deadline is None, "disarmed once leader work stopped"


async def test_after_a_lost_term_the_guard_gives_leader_work_until_the_lease_ends() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    guard = Guard(clock)
    work = IgnoresCancellation(clock)
    task = asyncio.create_task(make_elector(api, clock, "a", guard=guard).run(work))
    await clock.run_for(0.1)
    api.fail_before = 1.0
    await clock.run_for(RENEW_DEADLINE)
    assert work.cancelled_at == [pytest.approx(RENEW_DEADLINE)]
    # The work ignores cancellation: the elector still waits, and only the guard can end the process,
    # at the moment another replica may take the lease (lease duration after the last renewal at t=0).
    await clock.run_for(LEASE_DURATION * 2)
    assert not task.done()
    assert guard.deadline == pytest.approx(LEASE_DURATION)
    assert guard.deadline == pytest.approx(work.cancelled_at[0] + LEASE_DURATION - RENEW_DEADLINE)
    api.fail_before = 0.0
    work.give_up.set()
    await clock.run_for(0.1)
    assert task.done()
    with pytest.raises(LeadershipLost):
        task.result()
    assert guard.deadline is None


async def test_when_another_holder_is_seen_the_guard_allows_at_most_lease_duration_minus_renew_deadline() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    guard = Guard(clock)
    work = IgnoresCancellation(clock)
    task = asyncio.create_task(make_elector(api, clock, "a", guard=guard).run(work))
    await clock.run_for(0.1)
    intruder = ghost_lease("intruder", renew_time=micro_time(clock.wall()))
    intruder["metadata"]["resourceVersion"] = "9999"  # type: ignore[index]
    api.objects[LEASE] = intruder
    await clock.run_for(RETRY_PERIOD)
    assert work.cancelled_at == [pytest.approx(RETRY_PERIOD)]
    assert guard.deadline == pytest.approx(RETRY_PERIOD + LEASE_DURATION - RENEW_DEADLINE)
    work.give_up.set()
    await clock.run_for(0.1)
    with pytest.raises(LeadershipLost, match="intruder"):
        task.result()


class IgnoresCancellation:
    """Leader work that swallows every cancellation until ``give_up`` is set."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.cancelled_at: list[float] = []
        self.give_up = asyncio.Event()

    async def __call__(self) -> None:
        while not self.give_up.is_set():
            try:
                await self.give_up.wait()
            except asyncio.CancelledError:
                self.cancelled_at.append(self.clock.now())


async def test_leader_metrics_follow_the_terms() -> None:
    registry = CollectorRegistry()
    clock, api = FakeClock(), FakeLeaseApi()
    async with campaigning(make_elector(api, clock, "a", registry=registry), Work(clock)):
        await clock.run_for(0.1)
        assert registry.get_sample_value("cozygpu_leader_is_leader") == 1
        api.fail_before = 1.0
        await clock.run_for(RENEW_DEADLINE)
        assert registry.get_sample_value("cozygpu_leader_is_leader") == 0
        assert registry.get_sample_value("cozygpu_leader_lost_total") == 1
        assert (registry.get_sample_value("cozygpu_leader_attempt_failures_total") or 0) >= 1
    assert registry.get_sample_value("cozygpu_leader_terms_total") == 1


@pytest.mark.parametrize("seed", range(8))
async def test_two_candidates_on_a_flaky_partitioned_api_never_run_leader_work_at_once(seed: int) -> None:
    rng = random.Random(seed)
    clock, api = FakeClock(), FakeLeaseApi(rng=rng)
    api.fail_before, api.fail_after = 0.2, 0.1
    links = {"a": Link(api), "b": Link(api)}
    works = {"a": Work(clock), "b": Work(clock)}
    runs: dict[str, asyncio.Task[None]] = {}
    restarts = 0

    def start(identity: str) -> None:
        runs[identity] = asyncio.create_task(make_elector(links[identity], clock, identity).run(works[identity]))

    for identity in links:
        start(identity)
    try:
        for _ in range(200):
            # Each candidate's connection breaks and heals at random, for seconds at a time.
            for link in links.values():
                if rng.random() < 0.15:
                    link.down = not link.down
            await clock.run_for(3, step=0.25)
            assert not (works["a"].running and works["b"].running)
            for identity, task in runs.items():
                if task.done():  # a lost term ends the process; Kubernetes starts it again
                    with pytest.raises(LeadershipLost):
                        task.result()
                    restarts += 1
                    start(identity)
    finally:
        for task in runs.values():
            task.cancel()
        while not all(task.done() for task in runs.values()):
            await clock.run_for(0.5)
        for task in runs.values():
            with suppress(asyncio.CancelledError, LeadershipLost):
                await task
    assert restarts, "no term was lost: the test proved nothing"
    a_work, b_work = works["a"], works["b"]
    assert a_work.intervals, "a never led: the test proved nothing"
    assert b_work.intervals, "b never led: the test proved nothing"
    for a_start, a_stop in a_work.intervals:
        for b_start, b_stop in b_work.intervals:
            assert a_stop <= b_start or b_stop <= a_start, (a_work.intervals, b_work.intervals)
