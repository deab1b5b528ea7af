"""``cozygpu status``: what is held, what is free, what waits and why, who leads and whether the passes keep up.

Everything is read through the API server, so it works against any
kubeconfig: the objects the model reads (turned into the binder's snapshot),
the leader Lease and the settings ConfigMap. Nothing comes from the
controller's metrics endpoint.

- Classes: units, held and free as the binder computes them
  (``binder.reports.class_status`` on this snapshot), with the reason of the
  Available condition.
- Nodes (one per GPUNode): eligible or why not (the binder's Eligible rule on
  this snapshot), served, held and free units per resource name, and the age
  of the agent's last report.
- Devices Pending or Lost, with the binder's Bound condition; an order the
  binder has not decided on yet says so, with what the model decides now.
- Leader: the Lease holder and how long ago it renewed; stale when the
  renewal is older than the lease duration.
- Passes: placement is behind when a bind request waits longer than
  ``--answer-within`` (the webhooks' default bind wait); the statuses are
  behind when a pass on this snapshot would still write devices, or a class
  or node status differs from what the binder would write now.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from cozygpu.api.times import parse_time
from cozygpu.binder.reports import AVAILABLE, ELIGIBLE, class_status, node_conditions
from cozygpu.binder.status import BOUND_CONDITION, plan_writes
from cozygpu.commands import common
from cozygpu.commands.common import Cluster, Obj
from cozygpu.model.placement import KeepPending, MarkLost, PassPlan, plan_pass
from cozygpu.model.snapshot import DeviceKey, Phase

DEFAULT_ANSWER_WITHIN = 10.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cozygpu status", description=__doc__.splitlines()[0])
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument("--answer-within", type=float, default=DEFAULT_ANSWER_WITHIN, metavar="SECONDS",
                        help="a bind request waiting longer means placement is behind (default %(default)s)")
    common.add_cluster_flags(parser)
    return parser


def condition(obj: Obj | None, kind: str) -> dict[str, Any] | None:
    for entry in ((obj or {}).get("status") or {}).get("conditions") or ():
        if isinstance(entry, dict) and entry.get("type") == kind:
            return entry
    return None


def _seconds(delta: timedelta) -> float:
    return round(delta.total_seconds(), 1)


def leader(cluster: Cluster) -> dict[str, Any] | None:
    lease = cluster.lease
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime") or spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    holder = spec.get("holderIdentity") or None
    current = bool(holder) and renewed is not None and isinstance(duration, int) and \
        cluster.now - renewed <= timedelta(seconds=duration)
    return {"namespace": lease["metadata"].get("namespace"), "holder": holder,
            "renewTime": spec.get("renewTime"),
            "renewedSecondsAgo": _seconds(cluster.now - renewed) if renewed else None,
            "leaseDurationSeconds": duration, "current": current}


def classes(cluster: Cluster) -> list[dict[str, Any]]:
    rows = []
    snapshot = cluster.snapshot
    for name in sorted(snapshot.classes):
        view = snapshot.classes[name]
        computed = class_status(snapshot, view)
        available = computed["conditions"][0]
        rows.append({"name": name, "mode": str(view.mode), "resourceName": view.resource_name,
                     "units": computed["units"], "held": computed["held"], "free": computed["free"],
                     "available": available["status"] == "True", "reason": available["reason"],
                     "message": available["message"]})
    return rows


def nodes(cluster: Cluster) -> list[dict[str, Any]]:
    snapshot = cluster.snapshot
    rows = []
    for name in sorted(cluster.gpunodes):
        eligible = next(c for c in node_conditions(snapshot, name) if c["type"] == ELIGIBLE)
        inventory = snapshot.inventories.get(name)
        last = inventory.last_report if inventory is not None else None
        resources = [{"resourceName": c.resource_name, "served": c.served, "held": c.held,
                      "rawInUse": c.raw_in_use, "launching": c.window,
                      "free": max(c.room, 0)}
                     for c in sorted(snapshot.capacity.get(name, {}).values(), key=lambda c: c.resource_name)]
        rows.append({"name": name, "eligible": eligible["status"] == "True", "reason": eligible["reason"],
                     "message": eligible["message"], "resources": resources,
                     "lastReport": last.isoformat() if last else None,
                     "reportAgeSeconds": _seconds(cluster.now - last) if last else None,
                     "reportFresh": bool(inventory and inventory.fresh)})
    return rows


def model_reasons(plan: PassPlan) -> dict[DeviceKey, tuple[str, str]]:
    """What a pass on this snapshot decides for devices it keeps Pending or sends to Lost."""
    found: dict[DeviceKey, tuple[str, str]] = {}
    for action in plan.actions:
        if isinstance(action, KeepPending):
            found[action.device] = (action.refusal.reason.value, f"not accepted: {action.refusal.message}")
        elif isinstance(action, MarkLost):
            found[action.device] = (action.cause.reason.value, f"would be lost: {action.cause.message}")
    return found


def waiting_devices(cluster: Cluster, plan: PassPlan) -> list[dict[str, Any]]:
    snapshot = cluster.snapshot
    decided_now = model_reasons(plan)
    rows = []
    for key in sorted(snapshot.devices):
        device = snapshot.devices[key]
        if device.phase is Phase.BOUND:
            continue
        bound = condition(cluster.devices.get(key), BOUND_CONDITION)
        row: dict[str, Any] = {"namespace": key[0], "name": key[1], "class": device.class_name,
                               "count": device.count, "phase": str(device.phase), "decided": bound is not None}
        if bound is not None:
            row |= {"reason": bound.get("reason"), "message": bound.get("message"),
                    "since": bound.get("lastTransitionTime")}
        else:
            reason, message = decided_now.get(key, ("NotDecided", "the binder has not decided on it yet"))
            row |= {"reason": reason, "message": f"not decided yet; on this snapshot: {message}", "since": None}
        rows.append(row)
    return rows


def passes(cluster: Cluster, plan: PassPlan, answer_within: float) -> dict[str, Any]:
    snapshot = cluster.snapshot
    waiting = [d for d in snapshot.devices.values() if d.unanswered_request]
    times = [d.bind_request.time for d in waiting if d.bind_request is not None and d.bind_request.time]
    oldest = _seconds(cluster.now - min(times)) if times else None
    late = sum(1 for t in times if (cluster.now - t).total_seconds() > answer_within)
    writes = plan_writes(plan, snapshot, cluster.devices, now=cluster.now)
    behind = [f"GPUDevice {w.key[0]}/{w.key[1]}" for s in writes for w in s.devices]
    for name, view in snapshot.classes.items():
        computed = class_status(snapshot, view)
        status = cluster.classes.get(name, {}).get("status") or {}
        written = condition(cluster.classes.get(name), AVAILABLE)
        if any(status.get(k) != computed[k] for k in ("units", "held", "free")) or \
                (written or {}).get("reason") != computed["conditions"][0]["reason"]:
            behind.append(f"GPUClass {name}")
    for name in cluster.gpunodes:
        for wanted in node_conditions(snapshot, name):
            written = condition(cluster.gpunodes[name], wanted["type"])
            if (written or {}).get("reason") != wanted["reason"]:
                behind.append(f"GPUNode {name}")
                break
    return {
        "placement": {"waiting": len(waiting), "waitingDevices": sorted(f"{d.namespace}/{d.name}" for d in waiting),
                       "late": late, "oldestSeconds": oldest,
                       "answerWithinSeconds": answer_within, "healthy": late == 0},
        "statuses": {"behind": sorted(behind), "healthy": not behind},
    }


def gather(cluster: Cluster, *, answer_within: float) -> dict[str, Any]:
    plan = plan_pass(cluster.snapshot)
    return {"time": cluster.now.isoformat(), "leader": leader(cluster),
            "passes": passes(cluster, plan, answer_within), "classes": classes(cluster), "nodes": nodes(cluster),
            "devices": waiting_devices(cluster, plan)}


def render(report: dict[str, Any]) -> str:
    lines = []
    lead = report["leader"]
    if lead is None:
        lines.append("LEADER   none: no controller has led yet (no Lease cozygpu-leader)")
    else:
        state = "" if lead["current"] else "   STALE: the holder has not renewed within the lease duration"
        lines.append(f"LEADER   {lead['holder'] or '(released)'} in {lead['namespace']}, renewed "
                     f"{common.duration(lead['renewedSecondsAgo'])} ago (lease {lead['leaseDurationSeconds']}s){state}")
    lane, full = report["passes"]["placement"], report["passes"]["statuses"]
    if lane["waiting"] == 0:
        answer = "ok, no bind request waiting"
    else:
        oldest = common.duration(lane["oldestSeconds"])
        answer = (f"{'ok' if lane['healthy'] else 'BEHIND'}, {lane['waiting']} bind request(s) waiting, the oldest "
                  f"for {oldest} ({lane['late']} over {lane['answerWithinSeconds']:g}s)")
    shown = ", ".join(full["behind"][:5]) + (" ..." if len(full["behind"]) > 5 else "")
    whole = "ok, every status is what a pass would write now" if full["healthy"] else \
        f"BEHIND, a pass now would still change {len(full['behind'])} object(s): {shown}"
    lines += [f"PASSES   placement: {answer}", f"         statuses: {whole}", ""]
    if report["classes"]:
        lines.append(common.table(["CLASS", "MODE", "RESOURCE", "UNITS", "HELD", "FREE", "AVAILABLE"], [
            [c["name"], c["mode"], c["resourceName"], str(c["units"]), str(c["held"]), str(c["free"]),
             "yes" if c["available"] else f"no: {c['message']}"] for c in report["classes"]]))
    else:
        lines.append("no GPUClass exists yet")
    lines.append("")
    node_rows = []
    for n in report["nodes"]:
        served = ", ".join(f"{r['resourceName']} {r['held']}/{r['served']} held, {r['free']} free"
                           for r in n["resources"]) or "-"
        units = served if n["eligible"] else f"{served}; {n['message']}"
        node_rows.append([n["name"], "yes" if n["eligible"] else f"no ({n['reason']})",
                          common.duration(n["reportAgeSeconds"]), units])
    lines.append(common.table(["NODE", "ELIGIBLE", "REPORT", "UNITS"], node_rows) if node_rows
                 else "no GPUNode exists yet (no agent has reported)")
    lines.append("")
    if report["devices"]:
        lines.append(common.table(["DEVICE", "CLASS", "COUNT", "PHASE", "REASON", "WHY"], [
            [f"{d['namespace']}/{d['name']}", d["class"], str(d["count"]), d["phase"], str(d["reason"]),
             str(d["message"])] for d in report["devices"]]))
    else:
        lines.append("no GPUDevice is Pending or Lost")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    async with await common.connect(args) as client:
        cluster = await common.read_cluster(client, hoster_names=common.hoster_names(args))
    report = gather(cluster, answer_within=args.answer_within)
    print(json.dumps(report, indent=2) if args.output == "json" else render(report))
    return 0


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    if args.answer_within <= 0:
        print(f"cozygpu status: --answer-within {args.answer_within:g}: must be positive", file=sys.stderr)
        return 2
    return common.run("cozygpu status", args, run)
