"""``cozygpu catalog``: what a tenant namespace can order now, and why not (R-MOD-12).

A one-shot read of the cluster (no informers), turned into the same model
snapshot the binder and the webhooks use, so the answer here is the answer
admission would give. KubeVirt kinds that are not served are read as absent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from cozygpu import keys
from cozygpu.cache import specs
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.snapshot import build_snapshot
from cozygpu.kube import Client, errors
from cozygpu.model.catalog import CatalogEntry, catalog, refusal_for
from cozygpu.model.snapshot import Snapshot


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cozygpu catalog", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", "-n", required=True, help="the tenant namespace that would order")
    parser.add_argument("--count", type=int, help="also say whether an order of this many GPUs fits, per class")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--gpu-resource-names", default="", help="the hoster's GPU resource names, comma-separated")
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    return parser


async def _list(client: Client, spec: KindSpec) -> list[dict[str, Any]]:
    try:
        answer = await client.list_objects(spec.path, params=spec.selector_params())
    except errors.NotFound:
        return []  # a kind that is not served (KubeVirt not installed) has no objects to count
    items: list[dict[str, Any]] = answer.get("items", [])
    return items


async def read_snapshot(client: Client, *, hoster_names: Sequence[str] = ()) -> Snapshot:
    kinds = (specs.GPU_CLASSES, specs.GPU_DEVICES, specs.GPU_NODES, specs.NODES, specs.PODS, specs.VMIS,
             specs.TENANT_QUOTAS, specs.NAMESPACES, specs.KUBEVIRTS)
    lists = await asyncio.gather(*(_list(client, spec) for spec in kinds))
    classes, devices, gpunodes, nodes, pods, vmis, quotas, namespaces, kubevirts = lists
    return build_snapshot(
        now=datetime.now(UTC), classes=classes, devices=devices, gpunodes=gpunodes, nodes=nodes, pods=pods,
        vmis=vmis, quotas=quotas, namespaces=namespaces, kubevirts=kubevirts, hoster_names=hoster_names,
    )


def catalog_row(entry: CatalogEntry, snapshot: Snapshot, count: int | None) -> dict[str, Any]:
    why = entry.blocked
    if count is not None:
        why = refusal_for(entry, count, gpu_class=snapshot.classes[entry.class_name])
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
    }


def render_table(rows: list[dict[str, Any]], *, count: int | None) -> str:
    headers = ["CLASS", "MODE", "FREE", "BEST NODE", "BUDGET LEFT", "MAX/ORDER", "ORDERABLE",
               f"ORDER OF {count}" if count is not None else "WHY NOT"]
    table = [headers]
    for row in rows:
        verdict = row["message"] or ("fits" if count is not None else "")
        table.append([
            row["class"], row["mode"], str(row["freeInCluster"]),
            f"{row['bestNode'] or '-'} ({row['freeOnBestNode']})", row["budgetLeft"],
            "unlimited" if row["maxCount"] is None else str(row["maxCount"]), str(row["orderable"]), verdict,
        ])
    widths = [max(len(line[i]) for line in table) for i in range(len(headers) - 1)]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)) + "   " + line[-1]
        for line in table
    ).rstrip()


async def run(args: argparse.Namespace) -> int:
    names = [name for name in args.gpu_resource_names.split(",") if name]
    async with await Client.from_kubeconfig(args.kubeconfig) as client:
        snapshot = await read_snapshot(client, hoster_names=names)
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
    try:
        return asyncio.run(run(args))
    except errors.KubeError as err:
        print(f"cozygpu catalog: {err}", file=sys.stderr)
        return 1
