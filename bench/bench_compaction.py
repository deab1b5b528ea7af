"""Bench of compaction (R-BIND-11): what planning it costs, and what an order that needs none pays for it.

Run: ``python bench/bench_compaction.py [--nodes 5000] [--holds-per-node 4]``. Prints figures, never asserts
time. The fleet: ``--nodes`` nodes of 8 GPUs of one class, each with ``--holds-per-node`` stopped single-GPU
holds (20,000 at the defaults), so every node has 4 free and an order of 8 fits nowhere until holds move.

- **compaction plan**: ``placement.order_check`` of an order of 8 (the GPUDevice webhook's check: the order
  refusal, then the plan), and the binder's ``plan_pass`` placing it (the moves and the Bind) beside a pass
  over the same fleet with nothing to place, each the median of several runs with the best and the p90
  beside it; the target is 10 ms for the plan.
- **no compaction needed**: ``order_check`` of an order of 4 (it fits) with the class allowing compaction and
  with ``compaction: Never`` — the ratio says what the feature costs an order that needs none (1.0: nothing).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

from cozygpu.model.derive import derive_snapshot
from cozygpu.model.placement import Bind, order_check, plan_pass
from cozygpu.model.snapshot import (
    CompactionPolicy,
    DeviceView,
    GPUClassView,
    Mode,
    NodeInventory,
    NodeView,
    Phase,
    Snapshot,
)

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
H100 = "nvidia.com/GH100_H100_SXM5_80GB"


def fleet(nodes: int, holds_per_node: int, *, policy: CompactionPolicy, order: int = 0) -> Snapshot:
    names = [f"gpu-{i:05d}" for i in range(nodes)]
    devices = [DeviceView(namespace=f"tenant-{i % 50}", name=f"hold-{i}-{j}", class_name="h100", count=1,
                          phase=Phase.BOUND, node_name=node)
               for i, node in enumerate(names) for j in range(holds_per_node)]
    if order:
        devices.append(DeviceView(namespace="tenant-big", name="big", class_name="h100", count=order, created=NOW))
    gpu_class = GPUClassView(name="h100", mode=Mode.PASSTHROUGH, resource_name=H100, compaction=policy)
    return derive_snapshot(now=NOW, classes=[gpu_class], devices=devices, nodes=[NodeView(name=n) for n in names],
                    inventories=[NodeInventory(name=n, served={H100: 8}, resource_names=frozenset({H100}),
                                               last_report=NOW) for n in names])


def timed(work: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """Median, best and p90 of ``runs`` calls, in milliseconds."""
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        took.append((time.perf_counter() - started) * 1000)
    took.sort()
    return statistics.median(took), took[0], took[min(len(took) - 1, int(len(took) * 0.9))]


def row(what: str, figures: tuple[float, float, float], target: float | None = None) -> None:
    median, best, p90 = figures
    ratio = f"   {median / target:.2f} of the {target:g} ms target" if target else ""
    print(f"{what:<58} median {median:8.2f} ms   best {best:8.2f}   p90 {p90:8.2f}{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--holds-per-node", type=int, default=4)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    snap = fleet(args.nodes, args.holds_per_node, policy=CompactionPolicy.ALLOWED)
    holds = args.nodes * args.holds_per_node
    print(f"fleet: {args.nodes} nodes x 8 GPUs, {holds} stopped single-GPU holds, "
          f"{8 - args.holds_per_node} free per node")
    check = order_check(snap, "tenant-big", "h100", 8, label="big")
    assert check.compaction is not None, check.refusal  # the bench measures a plan, not a refusal
    print(f"order of 8: {check.compaction.said()} ({check.compaction.units_moved} units moved)")
    row("compaction plan: order_check of an order of 8", timed(
        lambda: order_check(snap, "tenant-big", "h100", 8, label="big"), args.runs), target=10.0)
    with_order = fleet(args.nodes, args.holds_per_node, policy=CompactionPolicy.ALLOWED, order=8)
    plan = plan_pass(with_order)
    print(f"binder pass: {len(plan.of(Bind))} binds (the moves and the order)")
    passes = max(3, args.runs // 3)
    row("binder pass placing it (plan_pass, moves and Bind)", timed(lambda: plan_pass(with_order), passes))
    row("binder pass of the same fleet with no order (for scale)", timed(lambda: plan_pass(snap), passes))
    never = fleet(args.nodes, args.holds_per_node, policy=CompactionPolicy.NEVER)
    allowed_fits = timed(lambda: order_check(snap, "tenant-big", "h100", 4, label="fits"), args.runs * 4)
    never_fits = timed(lambda: order_check(never, "tenant-big", "h100", 4, label="fits"), args.runs * 4)
    row("no compaction needed (order of 4), class Allowed", allowed_fits)
    row("no compaction needed (order of 4), class Never", never_fits)
    print(f"cost of the feature to an order that fits: {allowed_fits[0] / never_fits[0]:.2f}x (median ratio)")


if __name__ == "__main__":
    main()
