"""The binder on the pass driver: its works as lanes, one pass at a time, in the leader term only.

- The lanes go in ``binder.LANES`` order: placement first, then DRA hold
  claims, attachments, finalizers, usage records, reports and the read model's check. A
  housekeeping pass stops between writes when a placement pass is due
  (``PassDriver.preempted``), so an order waits behind one write, never
  behind a whole report round.
- One trigger over every kind the binder reads asks every work but the
  check for a pass, coalesced; a Node heartbeat, a quota's usage, a pod that
  uses no GPU or the binder's own GPUNode report asks for none
  (``Binder.worth_a_pass``). Each work then costs what moved for it.
- A new bind request or order asks for a placement pass the moment the
  device informer's handler sees it (R-BIND-3), so does a launcher window
  closing; a keyed work's key whose time comes (a report held back by
  ``report_every``, an idle-hold deadline, an attachment's grace, a refused
  write's backoff) asks for that work's pass, and the check for one every
  ``verify_every``.
- The works follow the cache's events only while the driver runs (the
  term): ``Binder.term`` is the driver's scope.
- The Events of the binder's writes are sent by a companion task beside the
  passes (``EventRecorder``): a placement cycle never waits for them.
- Read-your-writes (R-BIND-2) is the driver's; no pass starts before the
  cache knows every kind the binder reads.
- Each pass's snapshot brings the read model up to date (``ReadModel.snapshot``):
  a rebuild (a first list, a class's new resource name) runs in slices with
  the event loop let go between them, so the replica's watches and webhooks
  never wait behind a whole derivation.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from cozygpu.base.clock import Clock, LoopClock
from cozygpu.binder.binder import LANES, PLACEMENT, VERIFY, Binder
from cozygpu.binder.housekeeping import Stop
from cozygpu.cache.cache import Cache
from cozygpu.passes.driver import DriverConfig, Lane, LanePass, LaneWork, PassDriver, Progress
from cozygpu.passes.metrics import PassMetrics
from cozygpu.passes.writes import Writes

NAME = "binder"


def _pass(run: Callable[[Writes, Stop], Awaitable[Progress | None]], stop: Stop) -> LanePass:
    async def lane_pass(writes: Writes) -> Progress | None:
        return await run(writes, stop)

    return lane_pass


def binder_driver(binder: Binder, cache: Cache, *, registry: CollectorRegistry, clock: Clock | None = None,
                  config: DriverConfig | None = None) -> PassDriver[Lane, Lane]:
    """The driver that runs ``binder``'s works; ``run()`` it in the leader term."""
    needs = [spec.key for spec in binder.kinds]
    every_kind = cache.trigger(*binder.kinds, name=NAME, when=binder.worth_a_pass())
    driver: PassDriver[Lane, Lane]

    def stop(lane: Lane) -> Stop:
        return lambda: driver.preempted(lane)

    passes = {lane: _pass(run, stop(lane)) for lane, run in binder.lanes().items()}
    driver = PassDriver(
        NAME, LaneWork(passes), cache=cache, lanes=LANES,
        triggers={lane: [every_kind] for lane in LANES if lane is not VERIFY},
        clock=clock or LoopClock(), metrics=PassMetrics.on(registry), config=config,
        needs={lane: needs for lane in LANES}, companions=[("events", binder.events.run)], scope=binder.term,
    )
    binder.on_request(lambda: driver.request(PLACEMENT, "bind request"))
    binder.verifier.on_due(lambda: driver.request(VERIFY, "check due"))
    for lane, queue in binder.queues().items():
        queue.on_ready(functools.partial(driver.request, lane, "a key's time came"))
    return driver
