"""``cozygpu catalog``: what a tenant namespace can order now, and why not (R-MOD-12).

A one-shot read of the cluster (no informers), turned into the same model
snapshot the binder and the webhooks use, so the answer here is the answer
admission would give. KubeVirt kinds that are not served are read as absent.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from cozygpu import keys
from cozygpu.commands import common
from cozygpu.kube import Client
from cozygpu.model.catalog import CatalogEntry, catalog
from cozygpu.model.placement import order_check
from cozygpu.model.snapshot import Snapshot


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cozygpu catalog", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", "-n", required=True, help="the tenant namespace that would order")
    parser.add_argument("--count", type=int, help="also say whether an order of this many GPUs fits, per class")
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    common.add_cluster_flags(parser)
    return parser


async def read_snapshot(client: Client, *, hoster_names: Sequence[str] = ()) -> Snapshot:
    """The model's snapshot of the cluster, with these hoster names (the demo's reader)."""
    return (await common.read_cluster(client, hoster_names=list(hoster_names))).snapshot


def catalog_row(entry: CatalogEntry, snapshot: Snapshot, count: int | None) -> dict[str, Any]:
    """One class's row; with ``count``, the GPUDevice webhook's own answer to an order of that many (which may
    be placed after moving stopped holds, R-BIND-11: ``compaction`` says where and after how many moves)."""
    why, compaction = entry.blocked, None
    if count is not None:
        check = order_check(snapshot, entry.namespace, entry.class_name, count)
        why, compaction = check.refusal, check.compaction
    budget = "-" if entry.remaining_budget is None else str(entry.remaining_budget)
    if entry.limiting_budget is not None:
        budget += f" ({entry.limiting_budget.key} of {entry.limiting_budget.namespace})"
    return {
        "class": entry.class_name,
        "mode": str(entry.mode),
        "resourceName": entry.resource_name,
        "freeInCluster": entry.free_in_cluster,
        "freeOnBestNode": entry.free_on_best_node,
        "bestNode": entry.best_node,
        "budgetLeft": budget,
        "maxCount": entry.max_count,
        "entitled": entry.entitled,
        "orderable": entry.orderable,
        "reason": None if why is None else str(why.reason),
        "message": None if why is None else why.message,
        "compaction": None if compaction is None else compaction.said(),
    }


def render_table(rows: list[dict[str, Any]], *, count: int | None) -> str:
    headers = ["CLASS", "MODE", "FREE", "BEST NODE", "BUDGET LEFT", "MAX/ORDER", "ORDERABLE",
               f"ORDER OF {count}" if count is not None else "WHY NOT"]
    cells = []
    for row in rows:
        max_count = "unlimited" if row["maxCount"] is None else str(row["maxCount"])
        verdict = row["message"] or ("fits" if count is not None else "")
        best = f"{row['bestNode'] or '-'} ({row['freeOnBestNode']})"
        if row.get("compaction"):
            # The order fits nowhere as things stand: say that it needs stopped holds moved, and where it goes.
            best += f", {count} after compaction"
            verdict = f"fits: {row['compaction']}"
        cells.append([row["class"], row["mode"], str(row["freeInCluster"]), best, row["budgetLeft"], max_count,
                      str(row["orderable"]), verdict])
    return common.table(headers, cells)


async def run(args: argparse.Namespace) -> int:
    async with await common.connect(args) as client:
        cluster = await common.read_cluster(client, hoster_names=common.hoster_names(args))
    snapshot = cluster.snapshot
    rows = [catalog_row(entry, snapshot, args.count) for entry in catalog(snapshot, args.namespace)]
    if args.output == "json":
        print(json.dumps({"namespace": args.namespace, "count": args.count, "classes": rows}, indent=2))
    elif not rows:
        print(f"no GPUClass exists yet; a hoster creates them (kubectl get {keys.GPUCLASS_PLURAL})")
    else:
        print(render_table(rows, count=args.count))
    return 0


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    if args.count is not None and args.count < 1:
        print("cozygpu catalog: --count must be at least 1", file=sys.stderr)
        return 2
    return common.run("cozygpu catalog", args, run)
