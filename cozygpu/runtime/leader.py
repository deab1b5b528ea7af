"""Leader election on a ``coordination.k8s.io/v1`` Lease (R-RUN-4).

client-go's algorithm with ReleaseOnCancel, written for asyncio (the Python
libraries neither release on cancel nor keep ``leaseTransitions``, and one of
them writes local times with a ``Z``):

- A candidate tries every retry period (jittered by up to 1.2 x), and also
  watches its Lease: the moment it sees the lease released (holder emptied)
  or deleted it tries at once, so a SIGTERM hand-over does not wait out a
  retry period. The retry period stays the fallback when the watch fails. A
  lease is free when its holder is empty, or when the record this process
  last saw has not changed for the record's ``leaseDurationSeconds`` *on the
  local monotonic clock*. The remote ``renewTime`` is never compared with the
  local clock, so clock skew between machines does not matter.
- Every write carries the resourceVersion of the lease it read (the fast
  renewal path uses the one it last wrote), so two candidates never both win.
- The leader renews every retry period. It counts its deadline from the moment
  it *sent* its last successful write (an upper bound on how stale the others'
  view of it can be); once ``renew_deadline`` has passed without another
  success, or as soon as a read shows another holder, leader work is
  cancelled and awaited before anything else happens. That leaves
  ``lease_duration - renew_deadline`` for the work to unwind before another
  candidate may take over.
- A term ends for real. ``run`` leads one term only: after a lost term it
  raises ``LeadershipLost`` and never campaigns again (the process ends, as
  controller-runtime's does). An optional ``TermGuard`` (the process's
  watchdog) is armed for the lease's end (last renewal sent + lease
  duration), moved on by each renewal, shortened when the term ends to at most
  ``lease_duration - renew_deadline``, and disarmed once leader work has
  finished: work that ignores cancellation or blocks the loop cannot outlive it.
- Every request has a timeout of half the renew deadline, and every attempt
  is cut off at the deadline, so a hung request cannot keep a lost leader
  working.
- On stopping (cancellation) and after a lost term, the lease is released:
  holder ``""``, ``leaseDurationSeconds: 1``, acquire and renew time now,
  ``leaseTransitions`` unchanged, written only if this process still holds it.
  A watching candidate takes over at once instead of waiting out the lease.
  Release is bounded by the renew deadline.
- Timestamps are MicroTime in UTC whatever the machine's zone.

Time comes in through one ``cozygpu.base.clock.Clock``: its monotonic time
for validity, deadlines and sleeps, its UTC wall time only for the Lease's
timestamps, so tests run the whole algorithm on fake time.

Leader election does not fence: a paused process can believe it leads for a
moment after the lease moved on. Every write that decides something must carry
its own resourceVersion precondition.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, Final, Protocol

import attrs

from cozygpu.api.times import micro_time
from cozygpu.base.backoff import JITTER_FACTOR, Random, jittered, new_random
from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.deadline import deadline
from cozygpu.base.logging import get_logger
from cozygpu.kube import errors
from cozygpu.kube.client import Obj, resource_path
from cozygpu.runtime.metrics import LeaderMetrics

COORDINATION_GROUP: Final = "coordination.k8s.io"
COORDINATION_VERSION: Final = "v1"

_log = get_logger("cozygpu.leader")

#: What a leader runs for one term: started when the term begins, cancelled when it ends.
LeaderWork = Callable[[], Coroutine[Any, Any, None]]

class LeaseClient(Protocol):
    """The part of ``cozygpu.kube.Client`` leader election uses."""

    async def get_or_none(self, path: str, *, timeout: float | None = ..., attempts: int = ...) -> Obj | None: ...

    async def create(self, path: str, body: Obj, *, timeout: float | None = ..., attempts: int = ...) -> Obj: ...

    async def replace(self, path: str, body: Obj, *, timeout: float | None = ..., attempts: int = ...) -> Obj: ...

    def watch(self, path: str, *, params: Mapping[str, str | int | bool] | None = ..., read_timeout: float = ...,
              connect_timeout: float = ...) -> AsyncIterator[Obj]: ...


class TermGuard(Protocol):
    """Ends the process if leader work outlives its term (``cozygpu.runtime.process.Watchdog``)."""

    def arm(self, seconds: float, reason: str) -> None: ...

    def disarm(self) -> None: ...


@attrs.frozen(kw_only=True)
class LeaseRecord:
    """The election fields of a Lease spec."""

    holder: str
    duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def from_lease(cls, lease: Obj) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def spec(self) -> Obj:
        """The spec to write; other spec fields of the stored lease are kept by the caller."""
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


@attrs.frozen(kw_only=True)
class ElectionConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float
    renew_deadline: float
    retry_period: float

    def __attrs_post_init__(self) -> None:
        if not self.identity:
            raise ValueError("leader election needs a non-empty identity")
        if not self.lease_duration > self.renew_deadline > JITTER_FACTOR * self.retry_period > 0:
            raise ValueError("leader election needs lease_duration > renew_deadline > 1.2 x retry_period > 0")

    @property
    def request_timeout(self) -> float:
        """Each request's own limit: half the renew deadline, as controller-runtime sets it."""
        return self.renew_deadline / 2


class LeaderElector:
    """Campaigns for one Lease and runs leader work only while it holds it.

    ``await elector.run(work)`` campaigns until it leads, then calls
    ``work()`` in a task of its own for one term; the task is cancelled and
    awaited the moment the term ends (see the module docstring), and ``run``
    then raises ``LeadershipLost``. Cancelling ``run`` stops the work and
    releases the lease. A ``work`` that returns leaves the term running; one
    that raises ends it, releases the lease and propagates the error from ``run``.
    """

    def __init__(
        self,
        client: LeaseClient,
        config: ElectionConfig,
        *,
        clock: Clock | None = None,
        metrics: LeaderMetrics | None = None,
        rng: Random | None = None,
        guard: TermGuard | None = None,
    ) -> None:
        self._client = client
        self._guard = guard
        self.config = config
        self._clock: Clock = clock if clock is not None else LoopClock()
        self._wall = self._clock.wall
        self._metrics = metrics
        self._rng = rng if rng is not None else new_random()
        self._collection = resource_path(COORDINATION_GROUP, COORDINATION_VERSION, "leases",
                                         namespace=config.namespace)
        self._path = f"{self._collection}/{config.name}"
        self._log = _log.bind(lease=f"{config.namespace}/{config.name}", identity=config.identity)
        # What this process last saw of the lease, and when (local monotonic clock).
        self._observed: LeaseRecord | None = None
        self._observed_lease: Obj | None = None
        self._observed_spec: Obj | None = None
        self._observed_at = 0.0
        self._observed_version: str | None = None
        self._reported_holder = ""
        # When the last successful acquire or renew write was sent.
        self._renewed_at: float | None = None
        # A write of ours may have taken effect: release on the way out.
        self._may_hold = False
        self._leading = False
        # How late the renewal loop last woke from its sleep (a stopped or starved process), when it ended the term.
        self._woke_late: float | None = None

    # -- what others may ask ---------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """True from the moment leader work is started until it has been stopped."""
        return self._leading

    def write_fence(self) -> str | None:
        """Why leader work may not write now (None while it may): for ``Client.fenced``.

        Leader work may write from the start of its term until the renew
        deadline after the last renewal sent, on the local monotonic clock —
        the moment the elector itself gives the term up. Others can take the
        lease only ``lease_duration`` after they last saw it change, later
        still, so the gap is left for writes already in flight.
        """
        if not self._leading or self._renewed_at is None:
            return f"{self.config.identity} is not leading"
        late = self._clock.now() - (self._renewed_at + self.config.renew_deadline)
        if late >= 0:
            return (f"{self.config.identity}'s term is over: no renewal for the renew deadline "
                    f"({self.config.renew_deadline:g}s), {late:.3g}s ago")
        return None

    @property
    def holder(self) -> str:
        """The holder this process last observed ("" when free or unknown)."""
        return self._observed.holder if self._observed is not None else ""

    # -- the campaign ----------------------------------------------------------------------

    async def run(self, work: LeaderWork) -> None:
        """Campaign, lead one term, stop and release; raise ``LeadershipLost`` when the term was lost.

        Never campaigns twice: a process whose term ended has leader state it
        cannot trust, so it ends and starts afresh (as controller-runtime's
        manager exits on "leader election lost").
        """
        try:
            await self._acquire()
            reason = await self._lead(work)
        finally:
            # Stopped while campaigning: a write that was cut short may still have taken the lease.
            await self._release()
        raise LeadershipLost(reason)

    async def _acquire(self) -> None:
        self._log.info("campaigning for the lease")
        released = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            watcher = group.create_task(self._watch_for_release(released),
                                        name=f"lease watch of {self.config.identity}")
            try:
                while True:
                    released.clear()  # a release seen from here on wakes the wait below
                    if await self._attempt(self.config.renew_deadline):
                        return
                    period = self.config.retry_period
                    with contextlib.suppress(TimeoutError):
                        async with deadline(self._clock, jittered(period, self._rng)):
                            await released.wait()
            finally:
                watcher.cancel()

    async def _watch_for_release(self, released: asyncio.Event) -> None:
        """Set ``released`` whenever the Lease is seen free (released or deleted); never raises.

        Only an accelerator: the retry period stays the fallback, so a watch
        that fails is started again after a retry period, quietly.
        """
        params: dict[str, str | int | bool] = {"fieldSelector": f"metadata.name={self.config.name}",
                                               "allowWatchBookmarks": True, "timeoutSeconds": 300}
        warned = False
        while True:
            try:
                async for event in self._client.watch(self._collection, params=params,
                                                      connect_timeout=self.config.request_timeout):
                    kind = event.get("type")
                    lease = event.get("object") or {}
                    if kind == "DELETED" or (kind in ("ADDED", "MODIFIED")
                                             and not LeaseRecord.from_lease(lease).holder):
                        released.set()
            except Exception as err:  # any failure only slows the hand-over down to the retry period
                refused = isinstance(err, errors.ApiError) and not isinstance(err, errors.Gone | errors.ServerError)
                if refused and not warned:  # Forbidden, say: worth saying once, not every retry period
                    warned = True
                    self._log.warning("cannot watch the lease; taking it over on the retry period only",
                                      error=str(err))
                else:
                    self._log.debug("watching the lease failed", error=str(err) or type(err).__name__)
            await self._clock.sleep(self.config.retry_period)

    async def _lead(self, work: LeaderWork) -> str:
        """Run ``work`` for one term; return why the term was lost (cancellation and errors propagate)."""
        cfg = self.config
        self._leading = True
        self._log.info("started leading")
        if self._metrics is not None:
            self._metrics.terms.inc()
            self._metrics.is_leader.set(1)
        self._guard_term()
        try:
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(work(), name=f"leader work of {cfg.identity}")
                    try:
                        reason = await self._renew_until_lost()
                    finally:
                        self._term_ending()
                    raise _TermLost(reason)
            except* _TermLost as lost:
                reason = str(lost.exceptions[0])
                self._log.warning("lost the lease; leader work stopped", reason=reason)
                if self._metrics is not None:
                    self._metrics.lost.inc()
            return reason
        finally:
            # Leader work has finished here, in every path: the task group waited for it.
            self._leading = False
            if self._guard is not None:
                self._guard.disarm()
            if self._metrics is not None:
                self._metrics.is_leader.set(0)
            self._log.info("stopped leading; leader work has finished")
            await self._release()

    # -- the term's hard end -----------------------------------------------------------------

    def _term_end(self) -> float:
        """When another candidate may take the lease at the earliest (local monotonic time)."""
        assert self._renewed_at is not None
        return self._renewed_at + self.config.lease_duration

    def _guard_term(self) -> None:
        """(Re)arm the guard for the lease's end: renewals move it on while the term runs."""
        if self._guard is not None:
            left = self._term_end() - self._clock.now()
            ends = micro_time(self._wall() + dt.timedelta(seconds=left))
            self._guard.arm(left, f"leader work still ran when another replica could take the lease (it ran out "
                                  f"at {ends}, {self.config.lease_duration:g}s after the last renewal sent)")

    def _term_ending(self) -> None:
        """The term is over: leader work has until the lease's end, and never more than
        ``lease_duration - renew_deadline``, to stop.

        A process that was stopped (SIGSTOP) or starved past its lease finds
        the lease's end behind it: another replica may lead already, so the
        work gets no time at all, and the reason says how long ago the lease
        ran out and how late the process woke.
        """
        if self._guard is None:
            return
        cfg = self.config
        now = self._clock.now()
        left = self._term_end() - now
        if left <= 0:
            frozen = (f"; the process was stopped or starved for at least {self._woke_late:.3g}s (its renewal "
                      "woke that late)" if self._woke_late is not None else "")
            self._guard.arm(0.0, f"leader work still ran {-left:.3g}s after its lease ran out, when another "
                                 f"replica may lead already{frozen}")
            return
        limit = min(left, cfg.lease_duration - cfg.renew_deadline)
        self._guard.arm(limit, f"leader work did not stop within {limit:.3g}s of the end of its term")

    async def _renew_until_lost(self) -> str:
        """Renew every retry period; return why the term ended."""
        cfg = self.config
        while True:
            asleep = self._clock.now()
            await self._clock.sleep(cfg.retry_period)
            assert self._renewed_at is not None
            cutoff = self._renewed_at + cfg.renew_deadline
            late = self._clock.now() - asleep - cfg.retry_period
            if cutoff <= self._clock.now():  # the deadline passed while the loop slept: the process did not run
                self._woke_late = late
                return (f"no renewal within the renew deadline ({cfg.renew_deadline:g}s): the process was stopped "
                        f"or starved for at least {late:.3g}s (its renewal woke that late)")
            while True:
                remaining = cutoff - self._clock.now()
                if remaining <= 0:
                    return f"no renewal within the renew deadline ({cfg.renew_deadline:g}s)"
                if await self._attempt(remaining):
                    break
                if self.holder not in ("", cfg.identity):
                    return f"the lease is held by {self.holder}"
                await self._clock.sleep(min(cfg.retry_period, max(0.0, cutoff - self._clock.now())))

    async def _attempt(self, budget: float) -> bool:
        """One acquire-or-renew, cut off after ``budget`` seconds; errors count as failure."""
        try:
            async with deadline(self._clock, budget):
                won = await self._try_acquire_or_renew()
        except (errors.KubeError, TimeoutError) as err:
            self._log.warning("acquire or renew failed", error=str(err) or type(err).__name__)
            if self._metrics is not None:
                self._metrics.renew_failures.inc()
            won = False
        self._report_holder()
        return won

    # -- one try: client-go's tryAcquireOrRenew --------------------------------------------

    def _desired(self, now: dt.datetime, *, acquire_time: str | None, transitions: int) -> LeaseRecord:
        stamp = micro_time(now)
        return LeaseRecord(
            holder=self.config.identity,
            duration_seconds=int(self.config.lease_duration),
            acquire_time=acquire_time if acquire_time is not None else stamp,
            renew_time=stamp,
            transitions=transitions,
        )

    def _observed_valid(self, now: float) -> bool:
        return self._observed is not None and self._observed_at + self._observed.duration_seconds > now

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        me = cfg.identity
        kw: dict[str, Any] = {"timeout": cfg.request_timeout, "attempts": 1}

        # Fast path: the leader renews on top of the lease it last wrote.
        observed = self._observed
        if (observed is not None and observed.holder == me and self._observed_version is not None
                and self._observed_valid(self._clock.now())):
            record = self._desired(self._wall(), acquire_time=observed.acquire_time,
                                   transitions=observed.transitions)
            body = self._lease_body(self._observed_lease, record, self._observed_version)
            sent = self._clock.now()
            try:
                written = await self._client.replace(self._path, body, **kw)
            except (errors.Conflict, errors.NotFound) as err:
                self._log.debug("fast renewal refused; reading the lease", error=str(err))
            else:
                self._wrote(written, sent)
                return True

        lease = await self._client.get_or_none(self._path, **kw)
        if lease is None:
            record = self._desired(self._wall(), acquire_time=None, transitions=0)
            sent = self._clock.now()
            self._may_hold = True
            try:
                created = await self._client.create(self._collection, self._lease_body(None, record, None), **kw)
            except errors.AlreadyExists:
                return False
            self._wrote(created, sent)
            return True

        current = LeaseRecord.from_lease(lease)
        if (lease.get("spec") or {}) != self._observed_spec:
            self._observe(lease, self._clock.now())
        else:
            # The same record as before: its validity still counts from when it was first seen.
            self._observed_lease = lease
            self._observed_version = lease["metadata"]["resourceVersion"]
        if current.holder and current.holder != me and self._observed_valid(self._clock.now()):
            return False

        if current.holder == me:
            record = self._desired(self._wall(), acquire_time=current.acquire_time,
                                   transitions=current.transitions)
        else:
            record = self._desired(self._wall(), acquire_time=None, transitions=current.transitions + 1)
        body = self._lease_body(lease, record, lease["metadata"]["resourceVersion"])
        sent = self._clock.now()
        self._may_hold = True
        try:
            written = await self._client.replace(self._path, body, **kw)
        except errors.Conflict:
            return False
        self._wrote(written, sent)
        return True

    def _lease_body(self, base: Obj | None, record: LeaseRecord, version: str | None) -> Obj:
        """The whole Lease to write: ``base`` (the stored object) with the election fields replaced."""
        metadata: Obj = dict((base or {}).get("metadata") or {})
        metadata.update({"name": self.config.name, "namespace": self.config.namespace})
        metadata.pop("managedFields", None)
        if version is not None:
            metadata["resourceVersion"] = version
        return {
            "apiVersion": f"{COORDINATION_GROUP}/{COORDINATION_VERSION}",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {**((base or {}).get("spec") or {}), **record.spec()},
        }

    def _observe(self, lease: Obj, at: float) -> None:
        self._observed = LeaseRecord.from_lease(lease)
        self._observed_lease = lease
        self._observed_spec = lease.get("spec") or {}
        self._observed_version = lease["metadata"]["resourceVersion"]
        self._observed_at = at

    def _wrote(self, lease: Obj, sent: float) -> None:
        self._observe(lease, self._clock.now())
        self._renewed_at = sent
        self._may_hold = True
        if self._leading:
            self._guard_term()
        if self._metrics is not None:
            self._metrics.last_renew.set(self._wall().timestamp())

    def _report_holder(self) -> None:
        holder = self.holder
        if holder != self._reported_holder:
            self._reported_holder = holder
            self._log.info("observed a new lease holder", holder=holder or None)

    # -- release ---------------------------------------------------------------------------

    async def _release(self) -> None:
        """Hand the lease back if this process still holds it (bounded by the renew deadline)."""
        if not self._may_hold:
            return
        cfg = self.config
        kw: dict[str, Any] = {"timeout": cfg.request_timeout, "attempts": 1}
        try:
            async with deadline(self._clock, cfg.renew_deadline):
                while True:
                    try:
                        lease = await self._client.get_or_none(self._path, **kw)
                        if lease is None or LeaseRecord.from_lease(lease).holder != cfg.identity:
                            break
                        current = LeaseRecord.from_lease(lease)
                        stamp = micro_time(self._wall())
                        released = LeaseRecord(holder="", duration_seconds=1, acquire_time=stamp,
                                               renew_time=stamp, transitions=current.transitions)
                        body = self._lease_body(lease, released, lease["metadata"]["resourceVersion"])
                        written = await self._client.replace(self._path, body, **kw)
                    except errors.Conflict:
                        continue
                    except errors.KubeError as err:
                        self._log.warning("releasing the lease failed; retrying", error=str(err))
                        await self._clock.sleep(cfg.retry_period)
                        continue
                    self._observe(written, self._clock.now())
                    self._log.info("released the lease")
                    if self._metrics is not None:
                        self._metrics.released.inc()
                    break
        except TimeoutError:
            self._log.warning("could not release the lease in time; others wait for it to expire")
        finally:
            self._may_hold = False
            self._renewed_at = None


class LeadershipLost(Exception):
    """The term ended without being asked to: the process must not campaign again."""


class _TermLost(Exception):
    """Raised inside the term's task group to cancel leader work."""
