"""The hold ledger's metrics (R-LEDGER-1), on every replica, from its own read model.

    cozygpu_tenant_gpu_units{namespace, class, state}                 units held, running (a VM runs on them)
                                                                      and idle, per tenant namespace and class
    cozygpu_hold_unit_seconds_total{namespace, class, gpudevice, state}  unit-seconds each hold has held and
                                                                      left idle (state: held, idle)

Why every replica: the figures are derived from the holds' status
timestamps (``model.ledger``) and the wall clock, never from a process's
memory, so every replica exports the same values, before and after a leader
change, and a reader deduplicates with ``max without (instance, pod)``. A
hold's counter is monotonic (``heldSince`` never moves; idle time only adds
up); it ends with the hold, so a tenant's GPU-hours are
``sum by (namespace, class) (increase(...))`` over the holds (the chart's
recording rules). Series that name tenants are served only over the
authenticated HTTPS endpoint (R-LEDGER-3).

Not a collector of the registry: the scrape handler first brings the
replica's webhook model up to date on the event loop (``refresh``), then
``exposition()`` writes both families from that snapshot on the scrape's
thread (it never changes once made), in the text format (``base.exposition``:
two series per hold, 20,000 at 10,000 holds, too many for the library's
rendering; ``bench/bench_ledger.py`` prints both), served after the registry's.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable

from cozygpu.admission.view import NotReady
from cozygpu.base import exposition
from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.logging import get_logger
from cozygpu.model import ledger
from cozygpu.model.snapshot import Snapshot

log = get_logger("cozygpu.ledger")

_UNITS = "cozygpu_tenant_gpu_units"
_UNITS_HEADER = exposition.header(_UNITS, "GPU units per tenant namespace and class: held (Bound), running (a VM "
                                  "runs on them), idle (held, no VM runs on them)", "gauge")
_SECONDS_HEADER = exposition.header(
    "cozygpu_hold_unit_seconds", "Unit-seconds each hold has held its units and left them idle, from its status "
    "timestamps (every replica exports the same values: deduplicate with max without (instance, pod))", "counter")


class LedgerMetrics:
    """The two families (see the module docstring); empty until a first refresh found the model ready."""

    def __init__(self, source: Callable[[], Awaitable[Snapshot]], *, clock: Clock | None = None) -> None:
        #: The replica's model now (``SnapshotSource.snapshot``); ``NotReady`` while its caches are not.
        self._source = source
        self._clock: Clock = clock if clock is not None else LoopClock()
        self.snapshot: Snapshot | None = None
        self._lock = threading.Lock()
        #: (namespace, class, hold) -> its two series' names and labels, kept while the hold lasts.
        self._series: dict[tuple[str, str, str], tuple[str, str]] = {}

    async def refresh(self) -> None:
        """The model now (before a scrape); the last one kept while the replica's caches are not ready."""
        try:
            self.snapshot = await self._source()
        except NotReady as why:
            log.debug("ledger metrics from the last model: this replica's cache is not ready", why=str(why))

    def exposition(self) -> bytes:
        """Both families at the wall clock's now, in the Prometheus text format (version 0.0.4)."""
        snapshot = self.snapshot
        units: list[str] = []
        seconds: list[str] = []
        if snapshot is not None:
            holds = list(ledger.figures(snapshot, self._clock.wall()))
            for (namespace, class_name), figures in sorted(ledger.by_tenant(iter(holds)).items()):
                for state, value in (("held", figures.held), ("running", figures.running), ("idle", figures.idle)):
                    pairs = exposition.labels(("namespace", namespace), ("class", class_name), ("state", state))
                    units.append(f"{_UNITS}{pairs} {exposition.number(value)}\n")
            with self._lock:
                kept, self._series = self._series, {}
                for hold in holds:
                    key = (hold.namespace, hold.class_name, hold.name)
                    held, idle = self._series[key] = kept.get(key) or _hold_series(*key)
                    seconds.append(f"{held} {exposition.number(hold.held_unit_seconds)}\n"
                                   f"{idle} {exposition.number(hold.idle_unit_seconds)}\n")
        return b"".join((_UNITS_HEADER, "".join(units).encode(), _SECONDS_HEADER, "".join(seconds).encode()))


def _hold_series(namespace: str, class_name: str, name: str) -> tuple[str, str]:
    """A hold's two series of ``cozygpu_hold_unit_seconds_total``: state held, then idle."""
    def series(state: str) -> str:
        pairs = exposition.labels(("namespace", namespace), ("class", class_name), ("gpudevice", name),
                                  ("state", state))
        return f"cozygpu_hold_unit_seconds_total{pairs}"

    return series("held"), series("idle")
