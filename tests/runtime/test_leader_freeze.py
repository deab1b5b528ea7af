"""A leader whose process was stopped (SIGSTOP) or starved past its lease: what its term's end says.

On the fake clock: ``advance`` moves time and fires the timers that fall due
without letting any task run, which is what a frozen process sees when it is
continued: every sleep is over at once, and the clock is far on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from contextlib import suppress

import pytest

from cozygpu.api.times import micro_time
from cozygpu.base.clock import START
from cozygpu.runtime.leader import ElectionConfig, LeaderElector, LeadershipLost
from tests.runtime.fakes import FakeClock, FakeLeaseApi
from tests.runtime.test_leader_election import LEASE_DURATION, NAMESPACE, RENEW_DEADLINE, RETRY_PERIOD, Work


class Guard:
    """A ``TermGuard`` that keeps every arming: (when, seconds, reason)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.armed: list[tuple[float, float, str]] = []
        self.disarmed = False

    def arm(self, seconds: float, reason: str) -> None:
        self.armed.append((self.clock.now(), seconds, reason))

    def disarm(self) -> None:
        self.disarmed = True


def make_elector(api: FakeLeaseApi, clock: FakeClock, identity: str, guard: Guard) -> LeaderElector:
    config = ElectionConfig(namespace=NAMESPACE, name="cozygpu-leader", identity=identity,
                            lease_duration=LEASE_DURATION, renew_deadline=RENEW_DEADLINE, retry_period=RETRY_PERIOD)
    return LeaderElector(api, config, clock=clock, rng=random.Random(identity), guard=guard)


async def test_a_leader_frozen_past_its_lease_says_how_long_ago_the_lease_ran_out_and_how_long_it_was_frozen(
) -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    guard = Guard(clock)
    work = Work(clock)
    task = asyncio.create_task(make_elector(api, clock, "a", guard).run(work))
    await clock.run_for(0.1)  # leads from t=0; the renewal loop sleeps until t=2
    assert work.running
    frozen = 20.0
    clock.advance(frozen)  # stopped at t=0.1, continued at t=20.1: nothing ran in between
    await clock.run_for(0.1)
    await clock.run_for(RENEW_DEADLINE)  # the release (nothing else holds the lease) finishes
    with suppress(LeadershipLost):
        await asyncio.wait_for(task, 1)
    with pytest.raises(LeadershipLost) as lost:
        task.result()

    ended = [(seconds, reason) for _, seconds, reason in guard.armed if "lease ran out" in reason]
    assert len(ended) == 1, guard.armed
    seconds, reason = ended[0]
    # The lease (renewed at t=0) ran out at t=15; the loop woke at t=20.1 instead of t=2: 18.1 s late.
    lease_end, woke = LEASE_DURATION, 0.1 + frozen
    assert seconds == 0, "another replica may lead already: no time left for the work"
    assert f"still ran {woke - lease_end:.3g}s after its lease ran out" in reason
    assert f"stopped or starved for at least {woke - RETRY_PERIOD:.3g}s" in reason
    assert all(seconds >= 0 and "within -" not in reason for _, seconds, reason in guard.armed), guard.armed
    # The guard's standing reason (what the watchdog says if it fires before the loop runs) names the lease's end.
    assert guard.armed[0][2].endswith(f"(it ran out at {micro_time(START + dt.timedelta(seconds=lease_end))}, "
                                      f"{LEASE_DURATION:g}s after the last renewal sent)")
    assert f"stopped or starved for at least {woke - RETRY_PERIOD:.3g}s" in str(lost.value)
    assert len(work.intervals) == 1
    assert work.intervals[0][1] == pytest.approx(woke, abs=0.2), "the work stopped on waking"


async def test_a_term_lost_on_time_still_gives_the_work_until_the_lease_end() -> None:
    clock, api = FakeClock(), FakeLeaseApi()
    guard = Guard(clock)
    task = asyncio.create_task(make_elector(api, clock, "a", guard).run(Work(clock)))
    await clock.run_for(0.1)
    api.fail_before = 1.0  # every renewal fails from now on: the term ends at the renew deadline, awake
    await clock.run_for(RENEW_DEADLINE)
    api.fail_before = 0.0
    await clock.run_for(RENEW_DEADLINE)
    with suppress(LeadershipLost):
        await asyncio.wait_for(task, 1)
    ending = [(seconds, reason) for _, seconds, reason in guard.armed if "did not stop within" in reason]
    limit = LEASE_DURATION - RENEW_DEADLINE
    assert [reason for _, reason in ending] == [f"leader work did not stop within {limit:.3g}s of the end of its term"]
    assert ending[0][0] == pytest.approx(limit)
