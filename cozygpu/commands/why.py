"""``cozygpu why gpudevice/NAME`` or ``why vmi/NAME``: the last decision about it, and what would change it.

The last decision is what the binder wrote: the device's Bound condition,
its bind answer, and the Events about it (for a VMI: the answers on the
devices it names, its own Events). Then the model decides again on the
same snapshot the binder would build (``plan_pass``; for a VMI the check
its start gets from the VMI webhook: ``place_set`` counting the tenant's
orders not accepted yet) and says what would change the
answer: which budget to raise and by how much (checked by deciding again
with that budget raised, until the order fits or something else refuses),
which node has room, and which node would have room but is not eligible.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cozygpu import keys
from cozygpu.binder.status import BOUND_CONDITION
from cozygpu.commands import common
from cozygpu.commands.common import Cluster, Obj
from cozygpu.commands.status import condition
from cozygpu.kube import Client
from cozygpu.model import refusals
from cozygpu.model.eligibility import node_problem
from cozygpu.model.placement import Bind, KeepPending, MarkLost, Stay, device_sets, place_set, plan_pass
from cozygpu.model.refusals import Reason, Refusal
from cozygpu.model.snapshot import BudgetValue, DeviceKey, DeviceView, Phase, Snapshot, TenantBudgets

DEVICE_KINDS = frozenset({"gpudevice", "gpudevices", "gd"})
VMI_KINDS = frozenset({"vmi", "vmis", "virtualmachineinstance", "virtualmachineinstances"})
#: How many budgets a what-if raises before it gives up (a chain longer than the ancestry is a bug).
MAX_RAISES = 8


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cozygpu why", description=__doc__.splitlines()[0])
    parser.add_argument("target", metavar="KIND/NAME", help="gpudevice/NAME or vmi/NAME")
    parser.add_argument("--namespace", "-n", required=True, help="the namespace of the device or VMI")
    parser.add_argument("--output", "-o", choices=("text", "json"), default="text")
    common.add_cluster_flags(parser)
    return parser


class TargetError(ValueError):
    pass


def parse_target(text: str) -> tuple[str, str]:
    kind, _, name = text.partition("/")
    kind = kind.lower()
    if not name or "/" in name:
        raise TargetError(f"{text!r}: name it as gpudevice/NAME or vmi/NAME")
    if kind in DEVICE_KINDS:
        return "gpudevice", name
    if kind in VMI_KINDS:
        return "vmi", name
    raise TargetError(f"{text!r}: the kind is gpudevice or vmi, not {kind!r}")


# -- what would change it ----------------------------------------------------------------


def _raised(budgets: TenantBudgets, key: str, amount: int) -> TenantBudgets:
    def up(value: BudgetValue) -> BudgetValue:
        return attrs.evolve(value, amount=amount, text=str(amount)) if value.key == key else value

    return attrs.evolve(budgets, per_class={c: up(v) for c, v in budgets.per_class.items()},
                        total=up(budgets.total) if budgets.total is not None else None,
                        raw={n: up(v) for n, v in budgets.raw.items()})


def with_budget(snapshot: Snapshot, *, tenant: str, key: str, amount: int) -> Snapshot:
    """The snapshot with one budget of one tenant set to ``amount``."""
    budgets = dict(snapshot.budgets)
    budgets[tenant] = _raised(budgets[tenant], key, amount)
    return attrs.evolve(snapshot, budgets=budgets)


def budget_numbers(refusal: Refusal | None) -> tuple[str, int, int] | None:
    """(key, limit, what the order needs) of a budget refusal; None for any other refusal."""
    if refusal is None or refusal.reason is not Reason.BUDGET_EXCEEDED or refusal.key is None:
        return None
    if refusal.limit is None or refusal.in_use is None or refusal.requested is None:
        return None
    return refusal.key, refusal.limit, refusal.in_use + refusal.requested


def _node_hints(snapshot: Snapshot, members: Sequence[DeviceView], vmi_key: tuple[str, str] | None) -> list[str]:
    """Per node serving the set's resource: its room for the set, or why it may not take it."""
    hints: list[str] = []
    demand: dict[str, int] = {}
    classes = [snapshot.classes[d.class_name] for d in members if d.class_name in snapshot.classes]
    for device in members:
        gpu_class = snapshot.classes.get(device.class_name)
        if gpu_class is not None:
            demand[gpu_class.resource_name] = demand.get(gpu_class.resource_name, 0) + device.count
    vmi = snapshot.vmis.get(vmi_key) if vmi_key else None
    tolerations = tuple(t for c in classes for t in c.tolerations) + (vmi.tolerations if vmi else ())
    for resource, needs in sorted(demand.items()):
        serving = sorted(n for n, entries in snapshot.capacity.items() if resource in entries)
        if not serving:
            hints.append(f"no node reports {resource}: a node serving it (its device plugin and agent) is needed")
        for node in serving:
            entry = snapshot.capacity[node][resource]
            own = sum(d.count for d in members if d.holds_units and d.node_name == node)
            free = max(entry.room, 0) + own
            problem = node_problem(
                snapshot.nodes.get(node), node_name=node, tolerations=tolerations,
                selector=classes[0].node_selector if classes else None,
                node_selector=vmi.node_selector if vmi else None, node_affinity=vmi.node_affinity if vmi else None)
            inventory = snapshot.inventories.get(node)
            if problem is None and inventory is not None and not inventory.fresh:
                problem = refusals.report_stale(node)
            room = f"{free} of {entry.served} {resource} free for this set, it needs {needs}"
            if free >= needs and problem is not None:
                hints.append(f"node {node} has room ({room}) but {problem.message.removeprefix(f'node {node}: ')}")
            elif free >= needs:
                hints.append(f"node {node} has room ({room})")
            else:
                hints.append(f"node {node}: {room}; {needs - free} more would have to be freed there")
    return hints


def remedies(snapshot: Snapshot, refusal: Refusal, decide: Callable[[Snapshot], Refusal | None],
             members: Sequence[DeviceView], vmi_key: tuple[str, str] | None) -> list[str]:
    """What would change a refusal; ``decide(snapshot)`` is the same decision on another snapshot."""
    steps: list[str] = []
    current: Refusal | None = refusal
    what_if = snapshot
    for _ in range(MAX_RAISES):
        numbers = budget_numbers(current)
        if current is None or numbers is None:
            break
        key, limit, needed = numbers
        steps.append(f"raise budget {key} of {current.subject} from {limit} to {needed} (by {needed - limit})")
        what_if = with_budget(what_if, tenant=current.subject, key=key, amount=needed)
        current = decide(what_if)
    if steps and current is None:
        steps.append("with that, the order would be accepted now")
    if current is None:
        return steps
    reason = current.reason
    if steps:
        steps.append(f"then: {current.message}")
    if reason in (Reason.NO_FREE_UNITS, Reason.NO_NODE_WITH_ROOM, Reason.CAPACITY_LOST, Reason.NODE_GONE,
                  Reason.NODE_CORDONED, Reason.NODE_NOT_READY, Reason.TAINT_NOT_TOLERATED,
                  Reason.NODE_SELECTOR_MISMATCH, Reason.REPORT_STALE):
        steps += _node_hints(what_if, members, vmi_key)
    elif reason is Reason.MAX_COUNT_EXCEEDED:
        steps.append(f"order at most {current.limit} per GPUDevice (delete it and order again), or ask the hoster "
                     "for a class with a higher maxCount")
    elif reason is Reason.NOT_ENTITLED:
        steps.append(f"label the tenant namespace (or an ancestor) {keys.VGPU_ENTITLED_LABEL}="
                     f"{keys.VGPU_ENTITLED_VALUE}")
    elif reason is Reason.RAW_KEY_BLOCKED:
        steps.append(f"declare a {keys.QUOTA_PREFIX}<class> or {keys.QUOTA_TOTAL} budget in {current.subject}")
    elif reason is Reason.BUDGET_UNREADABLE:
        steps.append(f"fix budget {current.key} of {current.subject}: it must be a whole number of GPUs")
    elif reason in (Reason.UNKNOWN_CLASS, Reason.CLASS_DELETING):
        steps.append("order a class that exists and is not being deleted (cozygpu catalog -n NAMESPACE)")
    elif reason is Reason.CLASS_NOT_PERMITTED:
        steps.append("the hoster adds the class's resource name to KubeVirt's permittedHostDevices")
    return steps


# -- a device ------------------------------------------------------------------------------


def _set_of(snapshot: Snapshot, key: DeviceKey) -> tuple[tuple[DeviceKey, ...], tuple[str, str] | None]:
    for device_set in device_sets(snapshot):
        if key in device_set.members:
            return device_set.members, device_set.vmi
    return (key,), None


def decide_device(snapshot: Snapshot, key: DeviceKey) -> tuple[str, Refusal | None]:
    """What a placement pass on ``snapshot`` does with the device: a sentence, and the refusal if it is one."""
    plan = plan_pass(snapshot)
    device = snapshot.devices[key]
    for action in plan.actions:
        if isinstance(action, Stay) and key in action.devices:
            return f"it stays on node {action.node} ({action.why}): {action.cause.message}", None
        if isinstance(action, Stay) or action.device != key:
            continue
        if isinstance(action, KeepPending):
            return f"not accepted: {action.refusal.message}", action.refusal
        if isinstance(action, MarkLost):
            return f"it would be Lost: {action.cause.message}", action.cause
        if isinstance(action, Bind):
            moved = f" (moved off node {action.previous})" if action.previous else ""
            return f"it would be bound on node {action.node}{moved}", None
    if device.phase is Phase.LOST:
        members, vmi_key = _set_of(snapshot, key)
        views = [snapshot.devices[k] for k in members]
        placement = place_set(snapshot, views, vmi=snapshot.vmis.get(vmi_key) if vmi_key else None)
        if placement.refusal is not None:
            return f"it stays Lost: {placement.refusal.message}", placement.refusal
    if device.phase is Phase.BOUND:
        return f"it keeps node {device.node_name}", None
    return "nothing changes", None


def _event_rows(events: Sequence[Obj]) -> list[dict[str, Any]]:
    return [{"type": e.get("type"), "reason": e.get("reason"), "message": e.get("message"),
             "count": e.get("count") or 1,
             "last": e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp")}
            for e in events]


async def explain_device(client: Client, cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    snapshot = cluster.snapshot
    key = (namespace, name)
    raw = cluster.devices.get(key)
    view = snapshot.devices.get(key)
    released = snapshot.released.get(key)
    if raw is None or (view is None and released is None):
        return None
    status = raw.get("status") or {}
    events = await common.events_of(client, namespace, keys.GPUDEVICE_KIND, name, str(raw["metadata"]["uid"]))
    if view is None:
        assert released is not None  # its hold expired (R-LEDGER-2): it is out of every decision
        gone = refusals.hold_released(namespace, name, released.class_name)
        return {
            "object": f"GPUDevice {namespace}/{name}", "class": released.class_name, "count": released.count,
            "phase": str(released.phase), "node": None, "vmi": None, "bound": condition(raw, BOUND_CONDITION),
            "bindRequest": status.get("bindRequest"), "bindAnswer": status.get("bindAnswer"),
            "events": _event_rows(events), "now": gone.message, "reason": gone.reason.value,
            "wouldChangeIt": [f"order again: a new GPUDevice of class {released.class_name}, count {released.count}"],
        }
    now_text, refusal = decide_device(snapshot, key)
    members, vmi_key = _set_of(snapshot, key)
    steps: list[str] = []
    if refusal is not None:
        steps = remedies(snapshot, refusal, lambda s: decide_device(s, key)[1],
                         [snapshot.devices[k] for k in members], vmi_key)
    return {
        "object": f"GPUDevice {namespace}/{name}", "class": view.class_name, "count": view.count,
        "phase": str(view.phase), "node": view.node_name,
        "vmi": view.attachment.vmi if view.attachment else None,
        "bound": condition(raw, BOUND_CONDITION), "bindRequest": status.get("bindRequest"),
        "bindAnswer": status.get("bindAnswer"), "events": _event_rows(events),
        "now": now_text, "reason": refusal.reason.value if refusal else None,
        "wouldChangeIt": steps,
    }


# -- a VMI ---------------------------------------------------------------------------------


def vmi_members(cluster: Cluster, namespace: str, name: str) -> list[DeviceKey]:
    """The devices attached to the VMI, or whose last bind request came from it."""
    found = []
    for key, device in cluster.snapshot.devices.items():
        if key[0] != namespace:
            continue
        attached = device.attachment is not None and device.attachment.vmi == name
        asked = device.bind_request is not None and device.bind_request.vmi == name
        if attached or asked:
            found.append(key)
    return sorted(found)


async def explain_vmi(client: Client, cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    snapshot = cluster.snapshot
    members = vmi_members(cluster, namespace, name)
    vmi = snapshot.vmis.get((namespace, name))
    if not members and vmi is None:
        return None
    answers = []
    for key in members:
        status = cluster.devices[key].get("status") or {}
        request, answer = status.get("bindRequest") or {}, status.get("bindAnswer") or {}
        answers.append({"device": key[1], "phase": str(snapshot.devices[key].phase),
                        "node": snapshot.devices[key].node_name, "bindRequest": request or None,
                        "bindAnswer": answer or None,
                        "answered": bool(request) and answer.get("id") == request.get("id")})
    events = await common.events_of(client, namespace, "VirtualMachineInstance", name)
    views = [snapshot.devices[k] for k in members]
    label = f"VMI {namespace}/{name}"
    steps: list[str] = []
    reason = None
    if not views:
        now_text = "no GPUDevice is attached to it or was asked for by it"
    else:
        placement = place_set(snapshot, views, vmi=vmi, label=label, count_pending=True)
        if placement.refusal is None:
            now_text = f"a start now would be placed on node {placement.node}"
        else:
            refusal = placement.refusal
            reason = refusal.reason.value
            now_text = f"a start now would be refused: {refusal.message}"

            def decide(what_if: Snapshot) -> Refusal | None:
                return place_set(what_if, [what_if.devices[k] for k in members], vmi=vmi, label=label,
                                 count_pending=True).refusal

            steps = remedies(snapshot, refusal, decide, views, (namespace, name))
    return {"object": f"VMI {namespace}/{name}", "exists": vmi is not None,
            "vmiNode": vmi.node_name if vmi else None, "devices": answers, "events": _event_rows(events),
            "now": now_text, "reason": reason, "wouldChangeIt": steps}


# -- output --------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    lines = [report["object"]]
    if "phase" in report:
        where = f" on node {report['node']}" if report["node"] else ""
        attached = f", attached to VMI {report['vmi']}" if report["vmi"] else ""
        lines.append(f"  {report['phase']}{where}: {report['count']} of class {report['class']}{attached}")
        bound = report["bound"]
        if bound:
            lines.append(f"  last decision ({bound.get('lastTransitionTime', '?')}): Bound={bound.get('status')} "
                         f"{bound.get('reason')}: {bound.get('message')}")
        else:
            lines.append("  last decision: none yet (the binder has written no Bound condition)")
        answer = report["bindAnswer"]
        if answer:
            lines.append(f"  bind answer to request {answer.get('id')}: {answer.get('result')} "
                         f"{answer.get('reason')}: {answer.get('message')}")
    else:
        state = f"running on node {report['vmiNode']}" if report["vmiNode"] else \
            ("exists" if report["exists"] else "does not exist (a refused start leaves none)")
        lines.append(f"  the VMI {state}")
        for device in report["devices"]:
            answer = device["bindAnswer"]
            said = f"{answer.get('result')} {answer.get('reason')}: {answer.get('message')}" if answer else "none"
            pending = "" if device["answered"] or not device["bindRequest"] else " (its request is unanswered)"
            lines.append(f"  GPUDevice {device['device']}: {device['phase']}; last answer: {said}{pending}")
    for event in report["events"][-5:]:
        lines.append(f"  event {event['last']}: {event['type']} {event['reason']}: {event['message']}")
    lines.append(f"now: {report['now']}")
    if report["wouldChangeIt"]:
        lines.append("what would change it:")
        lines += [f"  - {step}" for step in report["wouldChangeIt"]]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    kind, name = parse_target(args.target)
    async with await common.connect(args) as client:
        cluster = await common.read_cluster(client, hoster_names=common.hoster_names(args))
        if kind == "gpudevice":
            report = await explain_device(client, cluster, args.namespace, name)
        else:
            report = await explain_vmi(client, cluster, args.namespace, name)
    if report is None:
        what = f"GPUDevice {args.namespace}/{name} does not exist" if kind == "gpudevice" else \
            f"VMI {args.namespace}/{name} does not exist and no GPUDevice names it"
        print(f"cozygpu why: {what}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2, default=str) if args.output == "json" else render(report))
    return 0


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        parse_target(args.target)
    except TargetError as err:
        print(f"cozygpu why: {err}", file=sys.stderr)
        return 2
    return common.run("cozygpu why", args, run)
