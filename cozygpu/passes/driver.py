"""``PassDriver``: the one leader-work loop — coalescing lanes, serialized passes, read-your-writes.

A pass is ``snapshot → plan → apply`` of a ``Work``. The driver owns
everything around it, once for every loop (docs/passes.md has the story):

- Lanes. A driver runs the lanes it is given, in their order: the binder
  names one per work (placement first, then its housekeeping works), the
  settings publisher has one. A
  lane is a flag: any number of requests while it is pending — ``request``
  from any callback, or a cache ``Trigger`` handed in for one or more lanes —
  make one pass.
- Order. One pass at a time, inline in ``run()``: passes never overlap, and
  the loop lets the event loop go between two (a pass that writes nothing
  never suspends), so the replica's watches and webhooks wait behind one
  pass at most, never a round of lanes. The first due lane in order goes,
  except that a due lane that has waited behind ``answer_streak`` passes of
  lanes before it goes next. A lane that
  ``resyncs`` is requested once when ``run()`` starts and ``resync`` seconds
  after each of its passes ends; what a lane's triggers gathered before then
  joins that lane's first pass.
- Slices. A long pass may stop between items when a lane before it is due
  (``preempted``) and say ``Progress.MORE``: its lane is requested again at
  once, and the earlier lane goes first. So placement waits behind one slice
  of housekeeping, never behind the whole of it.
- Read-your-writes (R-BIND-2). ``apply`` records what it wrote in ``Writes``
  (kept even when it raises half way), per lane; before a lane's next pass
  the cache must have seen each kind's latest resourceVersion written by it
  and, unless the lane ``sees_others`` is off, by every other lane. A lane
  that ``reads_assumed`` does not wait for writes recorded as assumed (its
  work reads them back itself); every other lane does. The wait is bounded
  by ``sync_timeout`` on the clock: a timeout is counted and logged, the
  writes stay unseen and the wait starts over — no pass decides from a view
  older than the writes it must see. It is given up the moment a lane that
  goes first is due (that lane runs; the wait starts again after). A kind
  that stopped being served has no view to be stale, so its writes are
  dropped.
- Syncs. A lane does not start before every kind it ``needs`` is known to
  the cache (listed, or known not to be served), and a pass that raised
  ``NotSynced`` for a kind waits for that kind the same way: the lane runs
  the moment the kind is known, with no backoff and no failure counted.
- Outcomes (``outcomes.classify``). OK resets the lane's backoffs. REQUEUED
  runs the lane again after its requeue backoff (short), or at once if a
  request came meanwhile. WAITING on a kind not served does the same on the
  failure backoff (its trigger fires when it is served); WAITING on a kind
  not synced waits for its sync (above). FAILED holds the lane for the
  failure backoff whatever comes, logs (a bug with its traceback) and never
  ends the loop.
- Metrics (``PassMetrics``) per loop and lane: duration, passes by outcome,
  queue wait (first request to start), and the write-sync wait and timeouts.

Structured concurrency: ``run()`` holds one task group (one forwarding task
per trigger, and each ``companion``: work that runs beside the passes for as
long as they run, such as the binder's Event sender); cancelling it cancels
the pass in progress, every forwarder and every companion.
Time is the injected ``Clock``'s. ``request`` never blocks and may be called
while the loop is not running (it is then pending for the next ``run()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Generic, NoReturn, Protocol, TypeVar

import attrs
from prometheus_client import CollectorRegistry

from cozygpu.base.backoff import Backoff
from cozygpu.base.clock import Cancellable, Clock, LoopClock
from cozygpu.base.deadline import deadline
from cozygpu.base.logging import get_logger
from cozygpu.cache.errors import KindNotServed, NotSynced, UnknownKind
from cozygpu.cache.informer import Informer
from cozygpu.cache.triggers import Trigger
from cozygpu.passes.metrics import PassMetrics
from cozygpu.passes.outcomes import Outcome, classify, is_bug
from cozygpu.passes.writes import Writes

_log = get_logger("cozygpu.passes")

ViewT = TypeVar("ViewT")
PlanT = TypeVar("PlanT")


@attrs.frozen
class Lane:
    """A queue of one kind of pass. A driver runs its lanes in the order it is given them (the first goes
    first), one pass at a time; a loop of several works (the binder's) names a lane per work."""

    value: str
    #: Its passes read their loop's assumed writes back themselves: they never wait for the cache to show them.
    reads_assumed: bool = False
    #: Its passes wait for the cache to show every lane's writes; else only its own (a work whose writes
    #: another one's decisions never read, or read guarded by their resourceVersion).
    sees_others: bool = True
    #: Requested when ``run()`` starts and ``resync`` seconds after each of its passes ends.
    resyncs: bool = True





class Progress(enum.Enum):
    """What a pass says of its work: done, or stopped at a slice's end with more to do (the lane is asked
    again at once, and any lane before it goes first)."""

    DONE = "done"
    MORE = "more"


class Work(Protocol[ViewT, PlanT]):
    """One loop's pass, in three steps the driver runs in order."""

    async def snapshot(self, lane: Lane) -> ViewT:
        """What the pass decides on: read from the cache (and, where it must, the API)."""
        ...

    def plan(self, view: ViewT) -> PlanT:
        """The decision, from the view alone."""
        ...

    async def apply(self, plan: PlanT, writes: Writes) -> Progress | None:
        """Carry the plan out, recording each accepted write in ``writes`` as it goes (``MORE``: stopped at
        a slice's end, the rest left for the lane's next pass)."""
        ...


#: One lane's pass when it snapshots, plans and applies in one coroutine, recording its writes.
LanePass = Callable[[Writes], Awaitable[Progress | None]]


@attrs.frozen
class LaneWork:
    """A ``Work`` whose lanes are one coroutine each (snapshot, plan and apply inside it).

    For passes that interleave several snapshot → plan → apply steps of their
    own (the binder's); the driver's guarantees hold around the whole pass. A
    lane without a pass has nothing to do.
    """

    passes: Mapping[Lane, LanePass]

    async def snapshot(self, lane: Lane) -> Lane:
        return lane

    def plan(self, view: Lane) -> Lane:
        return view

    async def apply(self, plan: Lane, writes: Writes) -> Progress | None:
        run = self.passes.get(plan)
        return None if run is None else await run(writes)


class SeesWrites(Protocol):
    """What the driver needs of ``cozygpu.cache.Cache``: read-your-writes, and each kind's informer (syncs)."""

    async def wait_for_resource_version(self, spec_or_key: str, resource_version: str,
                                        timeout: float | None = None) -> object: ...

    def informer(self, spec_or_key: str) -> Informer: ...


def _known(informer: Informer) -> bool:
    """Whether a pass can read the kind's answer: listed, or known not to be served."""
    return informer.has_synced or informer.served is False


#: Called after every pass with its lane, outcome and the error it raised (None when OK).
OutcomeHook = Callable[[Lane, Outcome, Exception | None], None]


@attrs.frozen(kw_only=True)
class DriverConfig:
    #: Seconds from the end of one pass of a resyncing lane to the resync that requests the next.
    resync: float = 300.0
    #: Passes of earlier lanes a due later lane may wait behind before it goes next.
    answer_streak: int = 10
    #: Seconds one wait for the cache to see the last pass's writes may take before it is counted.
    sync_timeout: float = 10.0
    requeue_initial: float = 0.1
    requeue_cap: float = 5.0
    failure_initial: float = 1.0
    failure_cap: float = 30.0
    #: Up to this fraction of each delay is added at random, so replicas' retries spread out.
    jitter: float = 0.2

    def __attrs_post_init__(self) -> None:
        if min(self.resync, self.sync_timeout, self.requeue_initial, self.failure_initial) <= 0:
            raise ValueError("resync, sync_timeout and the first backoff delays must be positive")
        if self.answer_streak < 1:
            raise ValueError("answer_streak must be at least 1")

    def backoff(self, clock: Clock, *, initial: float, cap: float) -> Backoff:
        # Reset by hand on OK only: a quiet period of failures held apart by the backoff is not a success.
        return Backoff(clock, initial=initial, cap=cap, jitter=self.jitter, reset_after=math.inf)


@attrs.define
class _LaneState:
    lane: Lane
    requeue: Backoff
    failure: Backoff
    pending: bool = False
    #: When the oldest request the next pass will answer came.
    since: float = 0.0
    reasons: set[str] = attrs.Factory(set)
    #: The lane does not run before this time ...
    hold_until: float = -math.inf
    #: ... unless a request lifts the hold (REQUEUED, WAITING; not FAILED).
    hold_lifts_on_request: bool = True
    #: Kinds the lane waits for the cache to know (listed, or not served) before its next pass.
    unsynced: set[str] = attrs.Factory(set)
    #: Passes of lanes before it that ran while it was due, since its own last pass.
    waited: int = 0
    #: When the resync requests it next (lanes that resync).
    resync_at: float = math.inf
    #: Its passes' writes the cache has not been shown to hold yet.
    unseen: Writes = attrs.Factory(Writes)

    def due(self, now: float) -> bool:
        return self.pending and self.hold_until <= now and not self.unsynced


class PassDriver(Generic[ViewT, PlanT]):
    """Runs one ``Work``'s passes (see the module docstring)."""

    def __init__(
        self,
        name: str,
        work: Work[ViewT, PlanT],
        *,
        cache: SeesWrites | None = None,
        triggers: Mapping[Lane, Sequence[Trigger]] | None = None,
        clock: Clock | None = None,
        metrics: PassMetrics | None = None,
        config: DriverConfig | None = None,
        on_outcome: OutcomeHook | None = None,
        needs: Mapping[Lane, Sequence[str]] | None = None,
        companions: Sequence[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = (),
        lanes: Sequence[Lane],
        scope: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
    ) -> None:
        self.name = name
        #: Entered for as long as ``run()`` runs (the binder's term: its works follow the cache's events).
        self._scope = scope
        #: (name, task) run beside the passes for as long as the driver runs (the binder's Event sender).
        self._companions = tuple(companions)
        self._work = work
        self._cache = cache
        unknown = {*(triggers or {}), *(needs or {})} - set(lanes)
        if unknown or len(set(lanes)) != len(lanes):
            raise ValueError(f"{name}: lanes must be distinct and name every lane of the triggers and needs")
        # One forwarding task per trigger, asking for every lane it is handed in for.
        self._triggers: dict[int, tuple[Trigger, list[Lane]]] = {}
        for lane, ts in (triggers or {}).items():
            for trigger in ts:
                self._triggers.setdefault(id(trigger), (trigger, []))[1].append(lane)
        #: Kind keys each lane reads: its passes start only once the cache knows them all.
        self._needs = {lane: tuple(keys) for lane, keys in (needs or {}).items()}
        self._clock = clock or LoopClock()
        self._metrics = metrics or PassMetrics.on(CollectorRegistry())
        self._config = config or DriverConfig()
        self._on_outcome = on_outcome
        self._log = _log.bind(loop=name)
        cfg = self._config
        #: In the order they go.
        self._lanes = {lane: _LaneState(
            lane,
            requeue=cfg.backoff(self._clock, initial=cfg.requeue_initial, cap=cfg.requeue_cap),
            failure=cfg.backoff(self._clock, initial=cfg.failure_initial, cap=cfg.failure_cap),
        ) for lane in lanes}
        self._wake = asyncio.Event()
        self._running = False
        self._group: asyncio.TaskGroup | None = None
        #: Kinds a task is waiting for the cache to know.
        self._watching: set[str] = set()

    # -- asking for passes ----------------------------------------------------------------

    def request(self, lane: Lane, reason: str = "") -> None:
        """Ask for a pass of ``lane``; coalesces with every request not yet taken. Never blocks."""
        state = self._lanes[lane]
        if not state.pending:
            state.pending = True
            state.since = self._clock.now()
        if reason:
            state.reasons.add(reason)
        if state.hold_lifts_on_request:
            state.hold_until = -math.inf
        self._wake.set()

    def pending(self, lane: Lane) -> bool:
        return self._lanes[lane].pending

    def preempted(self, lane: Lane) -> bool:
        """Whether a lane that goes before ``lane`` is due: a pass of ``lane`` that works in slices stops at
        the end of the one it is in (``Progress.MORE``)."""
        now = self._clock.now()
        for state in self._lanes.values():
            if state.lane == lane:
                return False
            if state.due(now):
                return True
        return False

    def waiting_for(self, lane: Lane) -> frozenset[str]:
        """The kinds ``lane`` waits for the cache to list (or to know unserved) before its next pass."""
        return frozenset(self._lanes[lane].unsynced)

    @property
    def unseen_writes(self) -> dict[str, str]:
        """The writes of past passes the cache has not been shown to hold yet."""
        merged = Writes()
        for state in self._lanes.values():
            merged.merge(state.unseen)
        return merged.as_dict()

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Run passes until cancelled; a pass's error never ends it."""
        if self._running:
            raise RuntimeError(f"{self.name}: the pass driver is already running")
        self._running = True
        try:
            now = self._clock.now()
            for state in self._lanes.values():
                state.hold_until, state.hold_lifts_on_request = -math.inf, True
                state.requeue.reset()
                state.failure.reset()
                state.since = now  # a request made while not running waited for the term, not the queue
                state.waited, state.resync_at = 0, math.inf
                if state.lane.resyncs:
                    self.request(state.lane, "start")
            for trigger, lanes in self._triggers.values():
                # What fired before now joins the first pass of its lanes (a resyncing one's: the start pass).
                if (reasons := trigger.poll()) is not None:
                    for lane in lanes:
                        self.request(lane, ",".join(sorted(reasons)))
            scope = self._scope() if self._scope is not None else contextlib.nullcontext()
            with scope:
                async with asyncio.TaskGroup() as group:
                    self._group = group
                    for companion, run in self._companions:
                        group.create_task(run(), name=f"{self.name} {companion}")
                    for trigger, lanes in self._triggers.values():
                        group.create_task(self._forward(trigger, lanes), name=f"{self.name} {trigger.name}")
                    for lane, needed in self._needs.items():
                        for key in needed:
                            self._wait_for_sync(self._lanes[lane], key)
                    await self._loop()
        finally:
            self._group = None
            self._watching.clear()
            for state in self._lanes.values():
                state.unsynced.clear()
            self._running = False

    async def _forward(self, trigger: Trigger, lanes: Sequence[Lane]) -> NoReturn:
        while True:
            reasons = ",".join(sorted(await trigger.wait()))
            for lane in lanes:
                self.request(lane, reasons)

    async def _loop(self) -> NoReturn:
        while True:
            self._wake.clear()  # before looking: a request from here on wakes the wait below
            now = self._clock.now()
            for state in self._lanes.values():
                if now >= state.resync_at:
                    state.resync_at = math.inf
                    self.request(state.lane, "resync")
            lane = self._choose(now)
            if lane is None:
                await self._sleep_until(self._next_time())
                continue
            if self._cache is not None and any(w.pending(assumed=a) for w, a in self._must_see(lane)):
                await self._see_writes_unless_preempted(self._cache, lane)
                continue  # look again: requests may have come while waiting
            after = False
            for state in self._lanes.values():  # the lanes after it that are due wait behind one more pass
                if after and state.due(now):
                    state.waited += 1
                after = after or state.lane == lane
            await self._pass(lane)
            # A pass that wrote nothing never suspended: let the replica's watches and webhooks go between two
            # passes, so they wait behind one pass, never behind a round of every lane.
            await asyncio.sleep(0)

    # -- waiting for a kind's sync --------------------------------------------------------

    def _wait_for_sync(self, state: _LaneState, key: str) -> bool:
        """Hold ``state``'s lane until the cache knows ``key``; False when there is no cache to ask."""
        if self._cache is None or self._group is None:
            return False
        try:
            informer = self._cache.informer(key)
        except UnknownKind:
            return False
        if _known(informer):
            return True
        if not state.unsynced:
            self._log.info("the next pass waits for the cache to list a kind", lane=state.lane.value, kind=key)
        state.unsynced.add(key)
        if key not in self._watching:
            self._watching.add(key)
            self._group.create_task(self._synced(informer), name=f"{self.name} sync {key}")
        return True

    async def _synced(self, informer: Informer) -> None:
        trigger = Trigger(f"{self.name} sync {informer.key}")
        informer.add_trigger(trigger)  # fires on the first list and on every served change
        try:
            while not _known(informer):
                await trigger.wait()
        finally:
            informer.remove_trigger(trigger)
            self._watching.discard(informer.key)
        for state in self._lanes.values():
            state.unsynced.discard(informer.key)
        self._wake.set()

    def _choose(self, now: float) -> Lane | None:
        """The first due lane in order, unless a later due lane has waited behind ``answer_streak`` passes of
        lanes before it: that one goes first."""
        first: Lane | None = None
        for state in self._lanes.values():
            if not state.due(now):
                continue
            if state.waited >= self._config.answer_streak:
                return state.lane
            first = first or state.lane
        return first

    def _next_time(self) -> float:
        times = [state.hold_until for state in self._lanes.values() if state.pending and not state.unsynced]
        return min([*(state.resync_at for state in self._lanes.values()), *times])

    async def _sleep_until(self, when: float) -> None:
        handle: Cancellable | None = None
        if when < math.inf:
            handle = self._clock.call_later(when - self._clock.now(), self._wake.set)
        try:
            await self._wake.wait()
        finally:
            if handle is not None:
                handle.cancel()

    # -- read-your-writes -----------------------------------------------------------------

    def _must_see(self, lane: Lane) -> list[tuple[Writes, bool]]:
        """The unseen writes a pass of ``lane`` waits for: (writes, whether their assumed ones count)."""
        assumed = not lane.reads_assumed
        return [(state.unseen, assumed) for state in self._lanes.values()
                if state.lane == lane or lane.sees_others]

    async def _see_writes_unless_preempted(self, cache: SeesWrites, lane: Lane) -> None:
        """``_see_writes`` for ``lane``, given up as soon as another lane goes first (a request for a lane
        before it): what was seen by then stays forgotten, the rest is waited for by the next look."""
        seeing = asyncio.ensure_future(self._see_writes(cache, lane))
        try:
            while not seeing.done():
                self._wake.clear()
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait((seeing, woken), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
                if not seeing.done() and self._choose(self._clock.now()) not in (lane, None):
                    return
        finally:
            if not seeing.done():
                seeing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await seeing
        seeing.result()

    async def _see_writes(self, cache: SeesWrites, lane: Lane) -> None:
        """Wait (bounded) until the cache has seen every write a pass of ``lane`` must see; what it has
        seen is forgotten, in every lane."""
        started = self._clock.now()
        must = self._must_see(lane)
        every = [state.unseen for state in self._lanes.values()]
        try:
            async with deadline(self._clock, self._config.sync_timeout):
                for writes, assumed in must:
                    for key, version in writes.items(assumed=assumed):
                        try:
                            await cache.wait_for_resource_version(key, version)
                        except KindNotServed:
                            # No store to be stale: when served again, its first list comes after the write.
                            for unseen in every:
                                unseen.discard(key)
                            continue
                        except UnknownKind:
                            self._log.error("a pass recorded a write to a kind the cache does not hold", kind=key,
                                            exc_info=True)
                            for unseen in every:
                                unseen.discard(key)
                            continue
                        for unseen in every:
                            unseen.seen(key, version)
        except TimeoutError:
            self._metrics.sync_timeouts.labels(self.name).inc()
            self._log.warning("the cache has not seen this loop's own writes yet; the next pass waits for them",
                              writes=self.unseen_writes, waited=self._config.sync_timeout)
        finally:
            self._metrics.sync_wait.labels(self.name).observe(self._clock.now() - started)

    # -- one pass -------------------------------------------------------------------------

    async def _pass(self, lane: Lane) -> None:
        state = self._lanes[lane]
        started = self._clock.now()
        reasons = sorted(state.reasons)
        self._metrics.queue_wait.labels(self.name, lane.value).observe(started - state.since)
        state.pending, state.reasons = False, set()
        state.hold_until, state.hold_lifts_on_request = -math.inf, True
        state.waited = 0
        writes = Writes()
        error: Exception | None = None
        progress: Progress | None = None
        try:
            view = await self._work.snapshot(lane)
            plan = self._work.plan(view)
            progress = await self._work.apply(plan, writes)
        except Exception as err:
            error = err
        finally:  # also when cancelled: the next term's first pass waits for them too
            if self._cache is not None:
                state.unseen.merge(writes)
        outcome = Outcome.OK if error is None else classify(error)
        ended = self._clock.now()
        self._metrics.duration.labels(self.name, lane.value).observe(ended - started)
        self._metrics.passes.labels(self.name, lane.value, outcome.value).inc()
        if lane.resyncs:
            state.resync_at = ended + self._config.resync
        self._settle(state, outcome, error, reasons)
        if outcome is Outcome.OK and progress is Progress.MORE:
            self.request(lane, "continued")
        if self._on_outcome is not None:
            try:
                self._on_outcome(lane, outcome, error)
            except Exception:
                self._log.exception("the outcome hook failed", lane=lane.value, outcome=outcome.value)

    def _settle(self, state: _LaneState, outcome: Outcome, error: Exception | None, reasons: list[str]) -> None:
        log = self._log.bind(lane=state.lane.value, reasons=reasons)
        if outcome is Outcome.OK:
            state.requeue.reset()
            state.failure.reset()
            log.debug("pass done")
            return
        again = state.pending  # a request came while the pass ran
        if isinstance(error, NotSynced) and self._wait_for_sync(state, error.kind):
            # Not a failure: the lane runs the moment the kind is listed (its backoffs stay as they were).
            log.info("pass waiting for a kind to sync", kind=error.kind)
            if not state.pending:
                state.pending, state.since = True, self._clock.now()
            return
        if outcome is Outcome.REQUEUED:
            delay = state.requeue.next_delay()
            log.info("pass requeued", error=str(error), after=0.0 if again else delay)
        elif outcome is Outcome.WAITING:
            delay = state.failure.next_delay()
            log.info("pass waiting for the cache", error=str(error), after=0.0 if again else delay)
        else:
            delay = state.failure.next_delay()
            again = False
            if error is not None and is_bug(error):
                log.error("pass failed", error=f"{type(error).__name__}: {error}", after=delay, exc_info=error)
            else:
                log.warning("pass failed", error=str(error), after=delay)
        if not state.pending:
            state.pending, state.since = True, self._clock.now()
        if not again:
            state.hold_until = self._clock.now() + delay
            state.hold_lifts_on_request = outcome is not Outcome.FAILED
