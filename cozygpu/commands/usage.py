"""``cozygpu usage``: GPU units each tenant namespace holds, runs and leaves idle, and its GPU-hours (R-LEDGER-1).

Why: a hoster bills held GPUs, also while a tenant's VMs are off, and a
tenant wants to see what it pays for without running Prometheus. The figures
come from the timestamps the binder writes into each hold's status
(``heldSince``, ``idleSince``, ``idleSeconds``; ``cozygpu.model.ledger``)
read once from the cluster like ``cozygpu catalog``, so every replica and this
command agree.

Contract:
- One row per (namespace, class) with a hold (a Bound GPUDevice): units held,
  running (a running VM uses them) and idle now; GPU-hours held and idle in
  the window; the idle share of those hours. ``--since D`` makes the window
  ``[now - D, now]``; without it each hold's window starts when it began.
- :func:`in_window` is the window arithmetic, per hold: held = units x
  overlap([heldSince, now], window); idle = units x (overlap([idleSince, now],
  window) + min(idleSeconds, the time the hold was held in the window before
  its current idle period began, or before now when none is open)). The
  status keeps only the sum of earlier idle periods, not when they were, so
  with a window that starts after ``heldSince`` that second term is an upper
  bound (exact when the window covers the whole hold, and when no earlier
  idle period exists). Idle never exceeds held.
- Only holds that exist now are counted: a hold deleted or expired inside
  the window is gone from the cluster. Billing reads the controller's
  counters (docs/usage.md).
- ``-o json`` is stable: keys sorted, rows by (namespace, class), holds by
  name, hours rounded to 6 decimals (docs/usage.md lists the fields).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

import attrs

from cozygpu.api.times import rfc3339
from cozygpu.base.durations import parse_duration
from cozygpu.commands import common
from cozygpu.model.ledger import figures
from cozygpu.model.snapshot import Ledger, Snapshot
from cozygpu.model.tenants import ancestry

HOUR: Final = 3600.0
#: Decimals of the GPU-hours and shares in JSON (3.6 ms of a unit): enough for a bill, stable to compare.
DECIMALS: Final = 6


@attrs.frozen(kw_only=True)
class Spent:
    """Unit-seconds one hold was held and left idle in a window (``idle <= held``)."""

    held: float
    idle: float


def _span(start: datetime, end: datetime) -> float:
    return max((end - start).total_seconds(), 0.0)


def in_window(ledger: Ledger, *, units: int, now: datetime, start: datetime | None) -> Spent:
    """What a hold of ``units`` with this ``ledger`` spent between ``start`` (None: since it began) and ``now``.

    A ledger with no ``heldSince`` (the binder has not written it yet) spent nothing. An ``idleSince`` before
    ``heldSince`` or after ``now`` is clamped into the hold's life.
    """
    if ledger.held_since is None:
        return Spent(held=0.0, idle=0.0)
    held_from = ledger.held_since if start is None else max(ledger.held_since, start)
    held = _span(held_from, now)
    idle_from = None if ledger.idle_since is None else min(max(ledger.idle_since, ledger.held_since), now)
    current = 0.0 if idle_from is None else _span(max(idle_from, held_from), now)
    # Earlier idle periods lie somewhere in [heldSince, idle_from); only their sum is stored, so at most the
    # part of them in the window is all of it, bounded by the time held in the window before idle_from.
    earlier = min(ledger.idle_seconds, _span(held_from, now if idle_from is None else idle_from))
    return Spent(held=units * held, idle=units * (current + earlier))


@attrs.frozen(kw_only=True)
class HoldUsage:
    name: str
    units: int
    running: bool
    held_since: datetime | None
    idle_since: datetime | None
    spent: Spent


@attrs.frozen(kw_only=True)
class Row:
    """One tenant namespace and class: units now, unit-seconds in the window, and its holds."""

    namespace: str
    class_name: str
    holds: tuple[HoldUsage, ...]

    @property
    def held(self) -> int:
        return sum(h.units for h in self.holds)

    @property
    def running(self) -> int:
        return sum(h.units for h in self.holds if h.running)

    @property
    def idle(self) -> int:
        return self.held - self.running

    @property
    def spent(self) -> Spent:
        return Spent(held=sum(h.spent.held for h in self.holds), idle=sum(h.spent.idle for h in self.holds))

    @property
    def idle_share(self) -> float | None:
        """Idle hours over held hours in the window; None when nothing was held in it."""
        spent = self.spent
        return spent.idle / spent.held if spent.held > 0 else None


def selected(namespace: str, *, scope: str | None, subtree: bool) -> bool:
    """Whether a hold in ``namespace`` counts: every namespace, ``scope`` alone, or ``scope``'s tenant subtree."""
    if scope is None:
        return True
    return namespace == scope or (subtree and scope in ancestry(namespace))


def usage(snapshot: Snapshot, now: datetime, *, since: timedelta | None = None, namespace: str | None = None,
          subtree: bool = False) -> list[Row]:
    """The rows for the holds of ``snapshot`` at ``now``, sorted by (namespace, class); each hold's ledger is the
    one its status carries (the units held, running and idle now are ``ledger.by_tenant``'s)."""
    start = None if since is None else now - since
    grouped: dict[tuple[str, str], list[HoldUsage]] = {}
    for hold in figures(snapshot, now):
        if not selected(hold.namespace, scope=namespace, subtree=subtree):
            continue
        ledger = snapshot.devices[(hold.namespace, hold.name)].ledger
        grouped.setdefault((hold.namespace, hold.class_name), []).append(HoldUsage(
            name=hold.name, units=hold.units, running=hold.running, held_since=hold.held_since,
            idle_since=hold.idle_since, spent=in_window(ledger, units=hold.units, now=now, start=start)))
    return [Row(namespace=ns, class_name=cls, holds=tuple(sorted(holds, key=lambda h: h.name)))
            for (ns, cls), holds in sorted(grouped.items())]


def _hours(unit_seconds: float) -> float:
    return round(unit_seconds / HOUR, DECIMALS)


def _time(when: datetime | None) -> str | None:
    return None if when is None else rfc3339(when)


def as_json(rows: Iterable[Row], *, now: datetime, since: str | None, namespace: str | None,
            subtree: bool) -> dict[str, Any]:
    """The ``-o json`` document (docs/usage.md): the question asked, then one entry per row."""
    def share(value: float | None) -> float | None:
        return None if value is None else round(value, DECIMALS)

    return {
        "now": rfc3339(now),
        "since": since,
        "namespace": namespace,
        "subtree": subtree,
        "rows": [{
            "namespace": row.namespace,
            "class": row.class_name,
            "unitsHeld": row.held,
            "unitsRunning": row.running,
            "unitsIdle": row.idle,
            "gpuHoursHeld": _hours(row.spent.held),
            "gpuHoursIdle": _hours(row.spent.idle),
            "idleShare": share(row.idle_share),
            "holds": [{
                "name": hold.name,
                "units": hold.units,
                "running": hold.running,
                "heldSince": _time(hold.held_since),
                "idleSince": _time(hold.idle_since),
                "gpuHoursHeld": _hours(hold.spent.held),
                "gpuHoursIdle": _hours(hold.spent.idle),
            } for hold in row.holds],
        } for row in rows],
    }


def render_table(rows: Sequence[Row], *, since: str | None) -> str:
    window = f" ({since})" if since else ""
    headers = ["NAMESPACE", "CLASS", "HELD", "RUNNING", "IDLE", f"GPU-HOURS HELD{window}", f"GPU-HOURS IDLE{window}",
               "IDLE SHARE"]
    cells = []
    for row in rows:
        spent, share = row.spent, row.idle_share
        cells.append([row.namespace, row.class_name, str(row.held), str(row.running), str(row.idle),
                      f"{spent.held / HOUR:.2f}", f"{spent.idle / HOUR:.2f}",
                      "-" if share is None else f"{share * 100:.0f}%"])
    return common.table(headers, cells)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cozygpu usage", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", "-n", help="one tenant namespace (default: every namespace)")
    parser.add_argument("--subtree", action="store_true",
                        help="with -n: that namespace and its tenant children (tenant-a: tenant-a-b, ...)")
    parser.add_argument("--since", metavar="DURATION",
                        help="GPU-hours over the last DURATION (a Go duration: 24h, 90m; default: since each hold "
                             "began)")
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    common.add_cluster_flags(parser)
    return parser


def window(text: str | None) -> timedelta | None:
    """``--since`` as a window length; ValueError for anything but a positive Go duration."""
    if text is None:
        return None
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise ValueError(f"--since {text!r} is not a duration such as 24h or 90m") from None
    if seconds <= 0:
        raise ValueError(f"--since {text!r} must be positive")
    return timedelta(seconds=seconds)


async def run(args: argparse.Namespace) -> int:
    async with await common.connect(args) as client:
        cluster = await common.read_cluster(client, hoster_names=common.hoster_names(args))
    rows = usage(cluster.snapshot, cluster.now, since=args.window, namespace=args.namespace,
                 subtree=args.subtree)
    if args.output == "json":
        print(json.dumps(as_json(rows, now=cluster.now, since=args.since, namespace=args.namespace,
                                 subtree=args.subtree), indent=2, sort_keys=True))
    elif not rows:
        where = "any namespace" if args.namespace is None else (
            f"{args.namespace}{' or its tenant children' if args.subtree else ''}")
        print(f"no GPUDevice holds units in {where}")
    else:
        print(render_table(rows, since=args.since))
    return 0


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.subtree and args.namespace is None:
        parser.error("--subtree needs -n/--namespace: the tenant whose subtree to read")
    try:
        args.window = window(args.since)
    except ValueError as err:
        print(f"cozygpu usage: {err}", file=sys.stderr)
        return 2
    return common.run("cozygpu usage", args, run)
