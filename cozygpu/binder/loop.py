"""The binder on the pass driver: one task in the leader term (R-BIND-1…3).

- The full lane is triggered by every change of the kinds the binder reads
  (``Binder.kinds``) that moves something a decision reads, coalesced into
  one pass, with the driver's resync: a Node heartbeat, a quota's usage, a
  pod that uses no GPU or the binder's own GPUNode report starts none
  (``Binder.worth_a_pass``, the live snapshot's ``matters``).
- The answer lane is requested by the device informer's handler the moment a
  device carries a new unanswered bind request or a new order appears, so
  the very next placement cycle decides it (R-BIND-3), before the next full
  pass; a request caught before the term is covered by the answer pass that
  ``on_request`` requests at once.
- The Events of the binder's writes are sent by a companion task beside the
  passes (``EventRecorder``): a placement cycle never waits for them.
- Reports held back by ``report_every`` ask for the full pass that writes them
  when they are due.
- Read-your-writes (R-BIND-2) is the driver's: it waits until the cache has
  seen every write the last pass recorded before the next pass snapshots.
- No pass starts before the cache knows every kind the binder reads (listed,
  or known not to be served): a kind that syncs late holds the first pass
  until it has synced, and no pass fails or backs off meanwhile.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from cozygpu.base.clock import Clock, LoopClock
from cozygpu.binder.binder import Binder
from cozygpu.cache.cache import Cache
from cozygpu.passes.driver import DriverConfig, Lane, LaneWork, PassDriver
from cozygpu.passes.metrics import PassMetrics

NAME = "binder"


def binder_driver(binder: Binder, cache: Cache, *, registry: CollectorRegistry, clock: Clock | None = None,
                  config: DriverConfig | None = None) -> PassDriver[Lane, Lane]:
    """The driver that runs ``binder``'s passes; ``run()`` it in the leader term."""
    needs = [spec.key for spec in binder.kinds]
    driver: PassDriver[Lane, Lane] = PassDriver(
        NAME, LaneWork({Lane.FULL: binder.full_pass, Lane.ANSWER: binder.answer_pass}), cache=cache,
        triggers={Lane.FULL: [cache.trigger(*binder.kinds, name=NAME, when=binder.worth_a_pass())]},
        clock=clock or LoopClock(),
        metrics=PassMetrics.on(registry), config=config, needs={Lane.FULL: needs, Lane.ANSWER: needs},
        companions=[("events", binder.events.run)],
    )
    binder.on_request(lambda: driver.request(Lane.ANSWER, "bind request"))
    binder.on_full_pass_due(lambda why: driver.request(Lane.FULL, why))
    return driver
