"""Bench of the hold ledger (R-LEDGER-1, R-LEDGER-2): what it costs the binder per event and a scrape per fleet.

Run: ``python bench/bench_ledger.py [--sizes 1000,5000,10000] [--holds-per-node 2]``. Prints figures, never
asserts time. Each fleet: nodes of 8 GPUs of one class with an ``idleHoldLimit``, ``--holds-per-node`` holds
per node (10,000 at 5,000 nodes), every other one under a running VM (a VMI and its launcher pod), the others
idle, each with its ledger timestamps.

- **per event (the binder, on the event loop)**: a VM start or stop touches one hold; the ledger lane judges
  that hold only (``ledger_writes`` of one key: its write, if any, and its deadline), and the read model takes
  the write back as a device whose units, usage and buckets did not move (``ModelTables.update`` of one device
  whose ledger changed). Both should be flat in the fleet's size: the per-event target of the read-model
  issue (no full pass).
- **every hold judged** (a term's first pass, and after a rebuild of the read model): the ledger work judges
  its keys for ``reconciler.SLICE`` (5 ms) a pass and leaves the rest for the next (the event loop is let go
  between them): how many holds one slice judges, and the whole for scale.
- **a scrape (off the event loop)**: ``LedgerMetrics.exposition`` of the fleet (figures, per-tenant sums, the
  two families written in the text format), which the metrics endpoint runs in a thread after the loop
  brought the webhook model up to date, as any webhook call does; beside it, the same families as a
  registry's collector rendered by ``generate_latest`` (how they were served before), and the series.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, generate_latest

from cozygpu.base.clock import FakeClock
from cozygpu.binder.ledger import ledger_writes
from cozygpu.binder.reconciler import SLICE
from cozygpu.model.derive import ModelTables
from cozygpu.model.snapshot import (
    Attachment,
    DeviceView,
    GPUClassView,
    Ledger,
    Mode,
    NodeInventory,
    NodeView,
    Phase,
    PodPhase,
    PodView,
    Snapshot,
    VMIView,
)
from cozygpu.runtime.ledger_metrics import LedgerMetrics

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the reference rendering is the tests'
from tests.support.library_metrics import LibraryLedgerFamilies

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
H100 = "nvidia.com/GH100_H100_SXM5_80GB"
HOUR = timedelta(hours=1)


def fleet(nodes: int, holds_per_node: int) -> tuple[ModelTables, Snapshot, dict[tuple[str, str], dict[str, Any]]]:
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    devices: list[DeviceView] = []
    vmis: list[VMIView] = []
    pods: list[PodView] = []
    for i, node in enumerate(names):
        for j in range(holds_per_node):
            namespace, name = f"tenant-{i % 50}", f"hold-{i}-{j}"
            running = (i + j) % 2 == 0
            ledger = Ledger(held_since=NOW - 48 * HOUR, idle_since=None if running else NOW - 3 * HOUR,
                            idle_seconds=3600.0)
            attachment = Attachment(vmi=f"vm-{name}", uid=f"u-{name}") if running else None
            devices.append(DeviceView(namespace=namespace, name=name, class_name="h100", count=1, phase=Phase.BOUND,
                                      node_name=node, attachment=attachment, ledger=ledger))
            if running:
                vmis.append(VMIView(namespace=namespace, name=f"vm-{name}", uid=f"u-{name}",
                                    active_pods=frozenset({f"p-{name}"})))
                pods.append(PodView(namespace=namespace, name=f"launcher-{name}", uid=f"p-{name}", node_name=node,
                                    phase=PodPhase.RUNNING, requests={H100: 1},
                                    claims_vmi=(f"vm-{name}", f"u-{name}")))
    gpu_class = GPUClassView(name="h100", mode=Mode.PASSTHROUGH, resource_name=H100,
                             idle_hold_limit=720 * HOUR, idle_hold_warning=72 * HOUR)
    tables = ModelTables()
    snapshot = tables.rebuild(now=NOW, classes=[gpu_class], devices=devices, nodes=[NodeView(name=n) for n in names],
                                inventories=[NodeInventory(name=n, served={H100: 8}, resource_names=frozenset({H100}),
                                                           last_report=NOW) for n in names],
                                pods=pods, vmis=vmis, namespaces=[])
    objects = {d.key: {"metadata": {"namespace": d.namespace, "name": d.name, "uid": f"uid-{d.name}",
                                    "resourceVersion": "1", "generation": 1},
                       "status": {"phase": "Bound", "nodeName": d.node_name, "heldSince": "2026-12-04T12:00:00Z",
                                  "idleSince": None if d.ledger.idle_since is None else "2026-12-06T09:00:00Z",
                                  "idleSeconds": 3600}} for d in devices}
    return tables, snapshot, objects


def timed(work: Callable[[], object], runs: int) -> float:
    """Median of ``runs`` calls, in milliseconds."""
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def measure(nodes: int, holds_per_node: int, runs: int) -> str:
    """One fleet's row."""
    tables, snapshot, objects = fleet(nodes, holds_per_node)
    key = next(k for k, d in snapshot.devices.items() if d.attachment is None)
    one = timed(lambda: ledger_writes(snapshot, objects, [key], now=NOW), runs * 20)
    device = snapshot.devices[key]
    flips = [attrs.evolve(device, ledger=attrs.evolve(device.ledger, idle_seconds=s)) for s in (1.0, 2.0)]
    state = {"i": 0}

    def read_back() -> None:
        state["i"] ^= 1
        tables.update(now=NOW, devices={key: flips[state["i"]]})

    back = timed(read_back, runs * 20)
    every = timed(lambda: ledger_writes(snapshot, objects, snapshot.devices.keys(), now=NOW), max(3, runs // 3))
    per_slice = SLICE * 1000 / (every / len(snapshot.devices))

    async def source() -> Snapshot:
        return snapshot

    collector = LedgerMetrics(source, clock=FakeClock(wall_start=NOW))
    collector.snapshot = snapshot
    ours = timed(collector.exposition, max(3, runs // 3))
    registry = CollectorRegistry()
    registry.register(LibraryLedgerFamilies(snapshot, NOW))
    library = timed(lambda: generate_latest(registry), max(3, runs // 3))
    text = collector.exposition()
    series = text.count(b"\n") - text.count(b"#")
    return (f"{nodes:>6} {len(snapshot.devices):>6} | {one * 1000:>12.1f} µs {back * 1000:>16.1f} µs | "
            f"{per_slice:>11,.0f} {every:>8.1f} ms | {ours:>12.1f} ms {library:>9.1f} ms {series:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--holds-per-node", type=int, default=2)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    print(f"{'':>13} | {'per event (on the loop)':^35} | {'every hold judged':^20} | {'a scrape (off the loop)':^36}")
    print(f"{'nodes':>6} {'holds':>6} | {'one hold judged':>15} {'its write read back':>19} | "
          f"{'in a slice':>11} {'all':>11} | {'ours':>15} {'library':>12} {'series':>7}")
    for nodes in (int(n) for n in args.sizes.split(",")):
        print(measure(nodes, args.holds_per_node, args.runs), flush=True)


if __name__ == "__main__":
    main()
