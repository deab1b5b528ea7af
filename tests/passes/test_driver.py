"""The pass driver on fake time: lanes coalesce and keep their order, passes never overlap, errors hold
the lane as their class says, and no pass starts before the cache has seen the last pass's writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

import pytest
from prometheus_client import CollectorRegistry

from cozygpu.base.clock import FakeClock, settle
from cozygpu.cache.errors import NotSynced
from cozygpu.cache.informer import Informer
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.reflector import Sink
from cozygpu.cache.store import Store
from cozygpu.cache.triggers import Trigger
from cozygpu.kube import errors
from cozygpu.passes.driver import DriverConfig, Lane, LaneWork, OutcomeHook, PassDriver, Progress
from cozygpu.passes.metrics import PassMetrics
from cozygpu.passes.outcomes import Outcome
from cozygpu.passes.writes import Writes

#: The lanes these tests drive: passes that answer requests (read their own writes back, no resync), then
#: passes over everything.
ANSWER = Lane("answer", reads_assumed=True, resyncs=False)
FULL = Lane("full")

DEVICES = KindSpec("gpu.cozystack.io", "v1alpha1", "gpudevices", "GPUDevice", True)
# Binary fractions throughout, so fake times add up exactly.
CONFIG = DriverConfig(resync=300.0, answer_streak=10, sync_timeout=5.0, requeue_initial=0.125, requeue_cap=4.0,
                      failure_initial=1.0, failure_cap=30.0, jitter=0.0)


def conflict() -> errors.Conflict:
    return errors.Conflict(409, {"reason": "Conflict", "message": "the object has been modified"},
                           method="PUT", path="/api/v1/namespaces/a/configmaps/b")


class Script:
    """A ``Work`` that records its passes and does what the test scripts for each one."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.passes: list[Lane] = []
        self.started: list[float] = []
        self.running = 0
        self.most_at_once = 0
        #: Set: passes wait for it in ``apply``.
        self.gate: asyncio.Event | None = None
        #: Raised by the next passes of each lane, in order.
        self.errors: dict[Lane, list[Exception]] = {}
        #: Recorded as written by the next pass.
        self.writes: dict[str, str] = {}
        #: Recorded as written and assumed (read back by the writer) by the next pass.
        self.assumed: dict[str, str] = {}
        #: Called at the start of each pass (the test's hook into the loop).
        self.on_snapshot: Callable[[Lane], None] | None = None

    async def snapshot(self, lane: Lane) -> Lane:
        self.passes.append(lane)
        self.started.append(self.clock.now())
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        if self.on_snapshot is not None:
            self.on_snapshot(lane)
        return lane

    def plan(self, view: Lane) -> Lane:
        return view

    async def apply(self, plan: Lane, writes: Writes) -> None:
        try:
            for kind, version in self.writes.items():
                writes.record(kind, version)
            for kind, version in self.assumed.items():
                writes.record(kind, version, assumed=True)
            self.writes, self.assumed = {}, {}
            if self.gate is not None:
                await self.gate.wait()
            if self.errors.get(plan):
                raise self.errors[plan].pop(0)
        finally:
            self.running -= 1


class Informers:
    """The cache's read-your-writes wait, over real informers fed by the test."""

    def __init__(self, *informers: Informer) -> None:
        self.by_key = {informer.key: informer for informer in informers}

    async def wait_for_resource_version(self, spec_or_key: str, resource_version: str,
                                        timeout: float | None = None) -> Store:
        return await self.by_key[spec_or_key].wait_for_resource_version(resource_version, timeout)

    def informer(self, spec_or_key: str) -> Informer:
        return self.by_key[spec_or_key]


def devices_synced_at(resource_version: str) -> tuple[Informer, Sink]:
    """A served GPUDevice informer whose first list is stored at ``resource_version``, and its feed."""
    informer = Informer(DEVICES)
    feed = informer.begin_cycle()
    feed.replace([], resource_version)
    return informer, feed


@asynccontextmanager
async def running(driver: PassDriver[Lane, Lane]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(driver.run())
    await settle()
    try:
        yield task
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


def make(clock: FakeClock, *, cache: Informers | None = None, triggers: dict[Lane, list[Trigger]] | None = None,
         metrics: PassMetrics | None = None, on_outcome: OutcomeHook | None = None,
         needs: dict[Lane, list[str]] | None = None) -> tuple[Script, PassDriver[Lane, Lane]]:
    script = Script(clock)
    driver = PassDriver("test", script, clock=clock, config=CONFIG, cache=cache, triggers=triggers, metrics=metrics,
                        on_outcome=on_outcome, needs=needs, lanes=(ANSWER, FULL))
    return script, driver


async def test_the_loop_starts_with_one_full_pass_covering_what_fired_before() -> None:
    clock = FakeClock()
    trigger = Trigger("devices")
    script, driver = make(clock, triggers={FULL: [trigger]})
    trigger.fire("before")
    async with running(driver):
        await settle()
    assert script.passes == [FULL]


async def test_an_answer_asked_for_before_the_term_goes_first() -> None:
    clock = FakeClock()
    answers = Trigger("answers")
    script, driver = make(clock, triggers={ANSWER: [answers]})
    answers.fire("bind request")
    async with running(driver):
        await settle()
    assert script.passes == [ANSWER, FULL]


async def test_many_requests_and_events_while_a_pass_runs_make_one_more_pass() -> None:
    clock = FakeClock()
    trigger = Trigger("devices")
    script, driver = make(clock, triggers={FULL: [trigger]})
    script.gate = asyncio.Event()
    async with running(driver):
        for _ in range(100):
            trigger.fire("devices")
            driver.request(FULL, "poke")
            await asyncio.sleep(0)
        script.gate.set()
        await settle()
        assert script.passes == [FULL, FULL]
        trigger.fire("devices")
        await settle()
    assert script.passes == [FULL, FULL, FULL]


async def test_an_answer_request_goes_before_the_full_pass_requested_earlier() -> None:
    clock = FakeClock()
    script, driver = make(clock)
    script.gate = asyncio.Event()
    async with running(driver):
        driver.request(FULL)
        driver.request(ANSWER)
        script.gate.set()
        await settle()
    assert script.passes == [FULL, ANSWER, FULL]


async def test_a_full_pass_waits_behind_at_most_answer_streak_answer_passes() -> None:
    clock = FakeClock()
    script, driver = make(clock)
    answers_asked = 0

    def keep_asking(lane: Lane) -> None:
        nonlocal answers_asked
        if lane is ANSWER and answers_asked < 24:
            answers_asked += 1
            driver.request(ANSWER, "webhook")

    script.gate = asyncio.Event()
    async with running(driver):
        driver.request(FULL, "event")  # pending behind the first (gated) full pass
        driver.request(ANSWER, "webhook")
        script.on_snapshot = keep_asking
        script.gate.set()
        await settle(200)
    first, *rest = script.passes
    assert first is FULL
    assert rest[:11] == [ANSWER] * 10 + [FULL], "the full pass ran after ten answer passes"
    assert rest[11:] == [ANSWER] * 15, "then the answers went on, the full lane having nothing pending"


async def test_the_loop_lets_others_run_between_two_passes_that_never_suspend() -> None:
    """A pass that writes nothing runs without a suspension; two in a row must not hold a webhook's answer
    or a watch event behind both."""
    clock = FakeClock()
    script, driver = make(clock)
    seen_by_others: list[list[Lane]] = []

    def first_pass(lane: Lane) -> None:
        if lane is ANSWER:
            asyncio.get_running_loop().call_soon(lambda: seen_by_others.append(list(script.passes)))

    script.on_snapshot = first_pass
    async with running(driver):
        driver.request(ANSWER, "webhook")
        driver.request(FULL, "event")
        await settle()
    assert script.passes == [FULL, ANSWER, FULL]
    assert seen_by_others == [[FULL, ANSWER]], "the second pass ran before anything else could"


async def test_passes_never_overlap() -> None:
    clock = FakeClock()
    trigger = Trigger("devices")
    script, driver = make(clock, triggers={FULL: [trigger]})
    script.gate = asyncio.Event()
    async with running(driver):
        for _ in range(5):
            trigger.fire("devices")
            driver.request(ANSWER)
            driver.request(FULL)
            await settle()
            assert script.running == 1
            script.gate.set()
            await asyncio.sleep(0)
            script.gate.clear()
        script.gate.set()
        await settle()
    assert script.most_at_once == 1
    assert len(script.passes) >= 6


async def test_the_full_lane_resyncs_resync_seconds_after_the_last_full_pass() -> None:
    clock = FakeClock()
    script, driver = make(clock)
    async with running(driver):
        await clock.run_for(299.0)
        assert script.passes == [FULL]
        await clock.run_for(1.0)
        assert script.passes == [FULL, FULL]
        await clock.run_for(100.0)
        driver.request(FULL)  # an event at 400 s: the next resync is at 700 s
        await clock.run_for(299.0)
        assert len(script.passes) == 3
        await clock.run_for(1.0)
    assert script.passes == [FULL] * 4
    assert script.started == [0.0, 300.0, 400.0, 700.0]


async def test_a_conflict_requeues_the_lane_soon_and_is_not_a_failure() -> None:
    clock = FakeClock()
    outcomes: list[Outcome] = []
    script, driver = make(clock, on_outcome=lambda lane, outcome, error: outcomes.append(outcome))
    script.errors = {FULL: [conflict(), conflict()]}
    async with running(driver):
        assert script.started == [0.0]
        await clock.run_for(1.0)
    assert script.started == [0.0, 0.125, 0.375], "requeued after 0.125 s, then 0.25 s"
    assert outcomes == [Outcome.REQUEUED, Outcome.REQUEUED, Outcome.OK]


async def test_a_request_lifts_a_requeue_hold() -> None:
    clock = FakeClock()
    script, driver = make(clock)
    script.errors = {FULL: [conflict()]}
    async with running(driver):
        await clock.run_for(0.0625)
        driver.request(FULL)
        await settle()
        assert script.started == [0.0, 0.0625]


async def test_without_a_cache_a_waiting_pass_runs_again_on_the_next_request_or_after_the_failure_backoff() -> None:
    clock = FakeClock()
    script, driver = make(clock)
    script.errors = {FULL: [NotSynced("gpunodes"), NotSynced("gpunodes")]}
    async with running(driver):
        await clock.run_for(0.5)
        assert script.started == [0.0], "not at the requeue backoff"
        driver.request(FULL, "gpunodes synced")
        await settle()
        assert script.started == [0.0, 0.5]
        await clock.run_for(1.75)
        assert len(script.started) == 2
        await clock.run_for(0.25)
    assert script.started == [0.0, 0.5, 2.5], "the second wait backed off to 2 s"


NODES = KindSpec("gpu.cozystack.io", "v1alpha1", "gpunodes", "GPUNode", True)


def passes_counted(registry: CollectorRegistry, outcome: str) -> float:
    return sum(registry.get_sample_value("cozygpu_passes_total", {"loop": "test", "lane": lane.value,
                                                                  "outcome": outcome}) or 0.0
               for lane in (ANSWER, FULL))


async def test_a_lane_starts_only_once_the_kinds_it_needs_are_listed_and_no_pass_waits_or_fails_meanwhile() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    informer, _ = devices_synced_at("5")
    nodes = Informer(NODES)
    script, driver = make(clock, cache=Informers(informer, nodes), metrics=PassMetrics.on(registry),
                          needs={FULL: [DEVICES.key, NODES.key], ANSWER: [NODES.key]})
    async with running(driver):
        driver.request(ANSWER, "webhook")
        await clock.run_for(120.0, step=1.0)
        assert script.passes == [], "no pass before the kinds it reads are listed"
        assert driver.waiting_for(FULL) == {NODES.key}
        nodes.begin_cycle().replace([], "7")
        await settle()
        assert script.passes == [ANSWER, FULL], "both lanes ran the moment the kind was listed"
        assert script.started == [120.0, 120.0]
    assert passes_counted(registry, "waiting") == 0
    assert passes_counted(registry, "failed") == 0


async def test_a_lane_needing_a_kind_known_not_to_be_served_is_not_held() -> None:
    clock = FakeClock()
    nodes = Informer(NODES)
    nodes.end_cycle("the CRD is not installed")
    script, driver = make(clock, cache=Informers(nodes), needs={FULL: [NODES.key]})
    async with running(driver):
        await settle()
        assert script.passes == [FULL]


async def test_a_pass_that_finds_a_kind_not_synced_waits_for_its_sync_not_the_failure_backoff() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    nodes = Informer(NODES)
    feed = nodes.begin_cycle()  # served, not listed yet; the lane does not say it needs the kind
    script, driver = make(clock, cache=Informers(nodes), metrics=PassMetrics.on(registry))
    script.errors = {FULL: [NotSynced(NODES.key), ValueError("a bug")]}
    async with running(driver):
        assert script.started == [0.0]
        await clock.run_for(0.5)
        driver.request(FULL, "event")  # a request does not start it either: the kind is not listed
        await clock.run_for(60.0, step=1.0)
        assert script.started == [0.0], "held for the sync, not for a backoff"
        assert driver.waiting_for(FULL) == {NODES.key}
        feed.replace([], "9")
        await settle()
        assert script.started == [0.0, 60.5], "ran the moment the kind was listed"
        await clock.run_for(0.75)
        assert len(script.started) == 2
        await clock.run_for(0.25)
        assert script.started[-1] == 61.5, "the failure after it held 1 s: the wait had not grown the backoff"
    assert passes_counted(registry, "failed") == 1


async def test_a_failure_holds_its_lane_for_the_backoff_whatever_comes_and_a_success_resets_it() -> None:
    clock = FakeClock()
    script, driver = make(clock)
    script.errors = {FULL: [ValueError("a bug"), ValueError("a bug")]}
    async with running(driver) as task:
        await clock.run_for(0.5)
        driver.request(FULL, "event")
        driver.request(ANSWER, "webhook")
        await settle()
        assert script.passes == [FULL, ANSWER], "the answer lane is not held by the full lane's failure"
        await clock.run_for(0.5)
        assert script.started == [0.0, 0.5, 1.0], "the full pass ran again after 1 s, not on the request"
        await clock.run_for(1.75)
        assert len(script.started) == 3
        await clock.run_for(0.25)
        assert script.started[-1] == 3.0, "the second failure held it 2 s"
        script.errors = {FULL: [ValueError("a bug")]}
        driver.request(FULL)  # OK at 3.0 reset the backoff; this one fails
        await settle()
        await clock.run_for(1.0)
        assert script.started[-2:] == [3.0, 4.0], "after a success the first failure holds 1 s again"
        assert not task.done(), "failures never end the loop"


async def test_the_next_pass_waits_until_the_cache_has_seen_the_last_pass_writes() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    informer, feed = devices_synced_at("5")
    script, driver = make(clock, cache=Informers(informer), metrics=PassMetrics.on(registry))
    script.writes = {DEVICES.key: "12"}
    async with running(driver):
        assert driver.unseen_writes == {DEVICES.key: "12"}
        driver.request(ANSWER, "webhook")
        await clock.run_for(1.0)
        feed.advance("11")
        await clock.run_for(1.0)
        assert script.passes == [FULL], "no pass before the cache has seen resourceVersion 12"
        feed.advance("12")
        await settle()
        assert script.passes == [FULL, ANSWER]
        assert driver.unseen_writes == {}
    assert registry.get_sample_value("cozygpu_pass_write_sync_seconds_sum", {"loop": "test"}) == 2.0


async def test_an_answer_pass_does_not_wait_for_assumed_writes_and_a_full_pass_does() -> None:
    clock = FakeClock()
    informer, feed = devices_synced_at("5")
    script, driver = make(clock, cache=Informers(informer))
    script.assumed = {DEVICES.key: "12"}
    async with running(driver):
        assert driver.unseen_writes == {DEVICES.key: "12"}
        driver.request(ANSWER, "webhook")
        await settle()
        assert script.passes == [FULL, ANSWER], "its writer reads an assumed write back itself"
        script.writes = {DEVICES.key: "14"}  # firm: the next answer pass waits for it
        driver.request(ANSWER, "webhook")
        await settle()
        assert script.passes == [FULL, ANSWER, ANSWER]
        driver.request(ANSWER, "webhook")
        await clock.run_for(1.0)
        assert script.passes == [FULL, ANSWER, ANSWER], "not before the cache has seen 14"
        feed.advance("14")
        await settle()
        assert script.passes[-1] is ANSWER
        script.assumed = {DEVICES.key: "20"}
        driver.request(ANSWER, "webhook")
        await settle()
        driver.request(FULL, "event")
        await clock.run_for(1.0)
        assert script.passes.count(FULL) == 1, "a full pass waits for assumed writes too"
        feed.advance("20")
        await settle()
        assert script.passes.count(FULL) == 2
        assert driver.unseen_writes == {}


async def test_a_write_sync_that_times_out_is_counted_and_still_no_pass_runs_before_it() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    informer, feed = devices_synced_at("5")
    script, driver = make(clock, cache=Informers(informer), metrics=PassMetrics.on(registry))
    script.writes = {DEVICES.key: "12"}
    async with running(driver):
        driver.request(FULL)
        await clock.run_for(11.0)
        assert registry.get_sample_value("cozygpu_pass_write_sync_timeouts_total", {"loop": "test"}) == 2
        assert script.passes == [FULL]
        feed.advance("12")
        await settle()
    assert script.passes == [FULL, FULL]


async def test_the_writes_of_a_pass_that_failed_half_way_are_waited_for_too() -> None:
    clock = FakeClock()
    informer, feed = devices_synced_at("5")
    script, driver = make(clock, cache=Informers(informer))
    script.writes = {DEVICES.key: "7"}
    script.errors = {FULL: [conflict()]}
    async with running(driver):
        await clock.run_for(1.0)
        assert script.passes == [FULL]
        feed.advance("7")
        await settle()
    assert script.passes == [FULL, FULL]


async def test_the_writes_of_a_pass_cancelled_with_its_term_are_waited_for_in_the_next_term() -> None:
    clock = FakeClock()
    informer, feed = devices_synced_at("5")
    script, driver = make(clock, cache=Informers(informer))
    script.writes = {DEVICES.key: "12"}
    script.gate = asyncio.Event()
    async with running(driver):
        assert script.running == 1
    assert driver.unseen_writes == {DEVICES.key: "12"}
    script.gate.set()
    async with running(driver):
        assert script.passes == [FULL], "the next term's first pass waits for the cache"
        feed.advance("12")
        await settle()
    assert script.passes == [FULL, FULL]


async def test_a_write_to_a_kind_no_longer_served_does_not_hold_the_loop() -> None:
    clock = FakeClock()
    informer, _ = devices_synced_at("5")
    script, driver = make(clock, cache=Informers(informer))
    script.writes = {DEVICES.key: "12"}
    async with running(driver):
        informer.end_cycle("no CustomResourceDefinition")
        driver.request(FULL)
        await settle()
    assert script.passes == [FULL, FULL]


async def test_metrics_count_passes_by_loop_lane_and_outcome_and_time_the_queue_and_the_pass() -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    script, driver = make(clock, metrics=PassMetrics.on(registry))
    gate = script.gate = asyncio.Event()
    async with running(driver):
        driver.request(ANSWER)
        await clock.run_for(2.0)
        script.errors = {FULL: [ValueError("a bug")]}
        gate.set()
        await settle()

    def sample(name: str, lane: Lane, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"loop": "test", "lane": lane.value, **labels})

    assert sample("cozygpu_passes_total", FULL, outcome="failed") == 1
    assert sample("cozygpu_passes_total", ANSWER, outcome="ok") == 1
    assert sample("cozygpu_pass_duration_seconds_sum", FULL) == 2.0
    assert sample("cozygpu_pass_queue_wait_seconds_sum", ANSWER) == 2.0
    assert PassMetrics.on(registry) is PassMetrics.on(registry), "one set of families per registry"


async def test_cancelling_run_ends_the_pass_in_progress_and_every_forwarder() -> None:
    clock = FakeClock()
    trigger = Trigger("devices")
    script, driver = make(clock, triggers={FULL: [trigger], ANSWER: [Trigger("answers")]})
    script.gate = asyncio.Event()
    before = asyncio.all_tasks()
    task = asyncio.create_task(driver.run())
    await settle()
    assert script.running == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert script.running == 0, "the pass was cancelled"
    assert asyncio.all_tasks() == before, "no task outlives run()"
    script.gate.set()
    async with running(driver):  # and the driver can run again (a next leader term)
        await settle()
    assert script.passes == [FULL, FULL]


async def test_running_one_driver_twice_at_once_is_refused() -> None:
    clock = FakeClock()
    _, driver = make(clock)
    async with running(driver):
        with pytest.raises(RuntimeError, match="already running"):
            await driver.run()


def test_assumed_writes_are_left_out_of_what_every_pass_waits_for_and_seen_forgets_up_to_a_version() -> None:
    writes = Writes()
    writes.record(DEVICES, "12", assumed=True)
    writes.record(DEVICES, "10")
    assert dict(writes.items()) == {DEVICES.key: "12"}
    assert dict(writes.items(assumed=False)) == {DEVICES.key: "10"}
    writes.seen(DEVICES, "11")
    assert not writes.pending(assumed=False)
    assert writes.pending()
    writes.seen(DEVICES, "12")
    assert not writes.pending()


def test_writes_keep_the_latest_resource_version_per_kind() -> None:
    writes = Writes()
    writes.record(DEVICES, "12")
    writes.record(DEVICES.key, "9")
    writes.record_object("configmaps", {"metadata": {"resourceVersion": "30"}})
    writes.record("configmaps", "")
    assert writes.as_dict() == {DEVICES.key: "12", "configmaps": "30"}


async def test_lane_work_runs_each_lanes_own_pass_and_keeps_what_it_wrote() -> None:
    clock = FakeClock()
    informer, feed = devices_synced_at("5")
    ran: list[str] = []

    async def full(writes: Writes) -> None:
        ran.append("full")
        writes.record(DEVICES, "9")

    async def answer(writes: Writes) -> None:
        ran.append("answer")

    driver: PassDriver[Lane, Lane] = PassDriver(
        "lanes", LaneWork({FULL: full, ANSWER: answer}), cache=Informers(informer), clock=clock,
        config=CONFIG, lanes=(ANSWER, FULL))
    async with running(driver):
        driver.request(ANSWER)
        await settle()
        assert ran == ["full"], "the answer pass waits for the full pass's write"
        feed.advance("9")
        await settle()
    assert ran == ["full", "answer"]


PLACE = Lane("place", reads_assumed=True, sees_others=False)
TIDY = Lane("tidy")
REPORT = Lane("report")


async def test_a_work_in_slices_lets_an_earlier_lane_go_between_its_slices() -> None:
    """A housekeeping pass that stops at a slice's end (``Progress.MORE``) is asked again at once; a lane
    before it that was asked meanwhile goes first, so it waits one slice, not the whole work."""
    clock = FakeClock()
    ran: list[str] = []
    items = list(range(6))
    driver: PassDriver[Lane, Lane]

    async def place(writes: Writes) -> None:
        ran.append("place")

    async def tidy(writes: Writes) -> Progress:
        while items:
            ran.append(f"tidy {items.pop(0)}")
            if len(items) == 4:
                driver.request(PLACE, "bind request")  # arrives while the slice runs
            if driver.preempted(TIDY):
                return Progress.MORE
        return Progress.DONE

    driver = PassDriver("works", LaneWork({PLACE: place, TIDY: tidy}), clock=clock, config=CONFIG,
                        lanes=(PLACE, TIDY))
    async with running(driver):
        await settle()
    assert ran == ["place", "tidy 0", "tidy 1", "place", "tidy 2", "tidy 3", "tidy 4", "tidy 5"]


async def test_a_lane_that_sees_only_its_own_writes_does_not_wait_for_another_lanes() -> None:
    clock = FakeClock()
    informer, feed = devices_synced_at("5")
    ran: list[str] = []

    async def place(writes: Writes) -> None:
        ran.append("place")
        writes.record(DEVICES, "7", assumed=True)

    async def tidy(writes: Writes) -> None:
        ran.append("tidy")
        writes.record(DEVICES, "9")

    driver: PassDriver[Lane, Lane] = PassDriver(
        "works", LaneWork({PLACE: place, TIDY: tidy}), cache=Informers(informer), clock=clock, config=CONFIG,
        lanes=(PLACE, TIDY))
    async with running(driver):
        assert ran == ["place"], "the tidy pass waits for the cache to show the placement's assumed write"
        feed.advance("7")
        await settle()
        assert ran == ["place", "tidy"]
        driver.request(PLACE, "bind request")
        await settle()
        assert ran == ["place", "tidy", "place"], "placement does not wait for the tidy work's write"
        driver.request(TIDY, "event")
        await clock.run_for(1.0)
        assert ran == ["place", "tidy", "place"], "tidy waits for its own write and placement's"
        feed.advance("9")
        await settle()
        assert ran == ["place", "tidy", "place", "tidy"]


async def test_a_wait_for_writes_gives_way_to_a_lane_that_goes_first() -> None:
    clock = FakeClock()
    informer, feed = devices_synced_at("5")
    ran: list[str] = []

    async def place(writes: Writes) -> None:
        ran.append("place")

    async def tidy(writes: Writes) -> None:
        ran.append("tidy")
        if ran.count("tidy") == 1:
            writes.record(DEVICES, "9")

    driver: PassDriver[Lane, Lane] = PassDriver(
        "works", LaneWork({PLACE: place, TIDY: tidy}), cache=Informers(informer), clock=clock, config=CONFIG,
        lanes=(PLACE, TIDY))
    async with running(driver):
        driver.request(TIDY, "event")
        await clock.run_for(1.0)
        assert ran == ["place", "tidy"], "the second tidy pass waits for the cache to show 9"
        driver.request(PLACE, "bind request")
        await settle()
        assert ran == ["place", "tidy", "place"], "a bind request is not held by tidy's wait"
        feed.advance("9")
        await settle()
        assert ran == ["place", "tidy", "place", "tidy"]


async def test_a_lane_behind_two_busy_lanes_still_goes_after_answer_streak_passes() -> None:
    clock = FakeClock()
    ran: list[str] = []
    driver: PassDriver[Lane, Lane]

    async def place(writes: Writes) -> None:
        ran.append("place")
        if ran.count("place") < 30:
            driver.request(PLACE, "bind request")

    async def tidy(writes: Writes) -> None:
        ran.append("tidy")
        if ran.count("tidy") < 30:
            driver.request(TIDY, "event")

    async def report(writes: Writes) -> None:
        ran.append("report")

    driver = PassDriver("works", LaneWork({PLACE: place, TIDY: tidy, REPORT: report}), clock=clock,
                        config=CONFIG, lanes=(PLACE, TIDY, REPORT))
    async with running(driver):
        await settle(200)  # the loop lets others go between two passes: sixty-one passes take as many rounds
    first_report = ran.index("report")
    assert first_report <= CONFIG.answer_streak + 1, ran[:first_report + 1]
    assert (ran.count("report"), ran.count("place"), ran.count("tidy")) == (1, 30, 30)
