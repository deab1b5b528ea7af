"""Refusals are values: one reason code and one message, shared by every caller.

Why: the GPUDevice webhook, the VMI webhook, the binder's answers and
conditions, the catalog and the CLI all explain the same decisions. If each
wrote its own text they would drift, and a person reading a refused order
would get a different story from ``kubectl describe`` than from the webhook.

Contract: a :class:`Refusal` names the object it is about, the limit that
refused and the numbers (limit, in use, requested) when there are any. The
message is built here, once, by the constructor functions below; callers
never format their own. Reason codes are stable strings (they end up in
``bindAnswer.reason``, condition reasons and metrics labels).
"""

from __future__ import annotations

import enum

import attrs


class Reason(enum.StrEnum):
    """Why an order, a set or a node was refused. Values are CamelCase, like Kubernetes reasons."""

    UNKNOWN_CLASS = "UnknownClass"
    CLASS_DELETING = "ClassDeleting"
    CLASS_NOT_PERMITTED = "ClassNotPermitted"
    INVALID_COUNT = "InvalidCount"
    MAX_COUNT_EXCEEDED = "MaxCountExceeded"
    NOT_ENTITLED = "NotEntitled"
    BUDGET_EXCEEDED = "BudgetExceeded"
    BUDGET_UNREADABLE = "BudgetUnreadable"
    RAW_KEY_BLOCKED = "RawKeyBlocked"
    NO_FREE_UNITS = "NoFreeUnits"
    NO_NODE_WITH_ROOM = "NoNodeWithRoom"
    UNKNOWN_DEVICE = "UnknownDevice"
    # Why a node cannot take (or keep) a set (R-MOD-8, R-BIND-5).
    NODE_GONE = "NodeGone"
    NODE_CORDONED = "NodeCordoned"
    NODE_NOT_READY = "NodeNotReady"
    TAINT_NOT_TOLERATED = "TaintNotTolerated"
    NODE_SELECTOR_MISMATCH = "NodeSelectorMismatch"
    REPORT_STALE = "ReportStale"
    CAPACITY_LOST = "CapacityLost"
    # A request carrying more than admission reads (issue 22): a list, a string, a count, JSON nesting.
    OVER_LIMIT = "OverLimit"


@attrs.frozen(kw_only=True)
class Refusal:
    """One refused decision: a reason code and a message naming the object, the limit and the numbers."""

    reason: Reason
    message: str
    #: The object the refusal is about: a namespace, ``class NAME``, ``node NAME``, ``GPUDevice NS/NAME``.
    subject: str
    #: The limit that refused (budget amount, free units, maxCount), when there is one.
    limit: int | None = None
    #: What already uses the limit, when that is meaningful.
    in_use: int | None = None
    #: What the refused order asked for.
    requested: int | None = None
    #: The quota key of a budget refusal (``gpu.cozystack.io/h100``, ``requests.nvidia.com/X``).
    key: str | None = None

    def __str__(self) -> str:
        return self.message


def _units(n: int) -> str:
    return f"{n} unit" if n == 1 else f"{n} units"


def budget_exceeded(*, key: str, namespace: str, limit: int, in_use: int, requested: int) -> Refusal:
    over = in_use + requested - limit
    return Refusal(
        reason=Reason.BUDGET_EXCEEDED,
        message=(
            f"budget {key} of {namespace}: {limit} allowed, {in_use} in use, order of {requested} exceeds it by {over}"
        ),
        subject=namespace,
        limit=limit,
        in_use=in_use,
        requested=requested,
        key=key,
    )


def budget_unreadable(*, key: str, namespace: str, text: str, problem: str) -> Refusal:
    return Refusal(
        reason=Reason.BUDGET_UNREADABLE,
        message=f"budget {key} of {namespace} cannot be read ({text!r}: {problem}); orders under it are refused",
        subject=namespace,
        key=key,
    )


def raw_key_blocked(*, key: str, namespace: str, class_name: str, resource_name: str) -> Refusal:
    return Refusal(
        reason=Reason.RAW_KEY_BLOCKED,
        message=(
            f"raw quota key {key} of {namespace} blocks class {class_name} (resource {resource_name}) "
            f"until {namespace} also declares a gpu.cozystack.io budget"
        ),
        subject=namespace,
        key=key,
    )


def unknown_class(class_name: str) -> Refusal:
    return Refusal(
        reason=Reason.UNKNOWN_CLASS, message=f"class {class_name} does not exist", subject=f"class {class_name}"
    )


def class_deleting(class_name: str) -> Refusal:
    return Refusal(
        reason=Reason.CLASS_DELETING,
        message=f"class {class_name} is being deleted and takes no new orders",
        subject=f"class {class_name}",
    )


def class_not_permitted(class_name: str, resource_name: str) -> Refusal:
    return Refusal(
        reason=Reason.CLASS_NOT_PERMITTED,
        message=(
            f"class {class_name}: resource {resource_name} is not in KubeVirt's permittedHostDevices, "
            "so no launcher pod could be rendered for it"
        ),
        subject=f"class {class_name}",
    )


def invalid_count(class_name: str, count: int) -> Refusal:
    return Refusal(
        reason=Reason.INVALID_COUNT,
        message=f"class {class_name}: an order needs at least 1 GPU, not {count}",
        subject=f"class {class_name}",
        limit=1,
        requested=count,
    )


def max_count_exceeded(class_name: str, *, max_count: int, requested: int) -> Refusal:
    return Refusal(
        reason=Reason.MAX_COUNT_EXCEEDED,
        message=(
            f"class {class_name}: maxCount {max_count} per device, "
            f"order of {requested} exceeds it by {requested - max_count}"
        ),
        subject=f"class {class_name}",
        limit=max_count,
        requested=requested,
    )


def not_entitled(class_name: str, namespace: str, *, label: str) -> Refusal:
    return Refusal(
        reason=Reason.NOT_ENTITLED,
        message=(
            f"class {class_name} is a VGPU class and {namespace} is not entitled to it "
            f"(no {label}=true on {namespace} or an ancestor)"
        ),
        subject=namespace,
    )


def no_free_units(class_name: str, *, free: int, requested: int) -> Refusal:
    return Refusal(
        reason=Reason.NO_FREE_UNITS,
        message=(
            f"class {class_name}: {_units(free)} free in the cluster, "
            f"order of {requested} exceeds it by {requested - free}"
        ),
        subject=f"class {class_name}",
        limit=free,
        requested=requested,
    )


def no_node_with_room(class_name: str, *, best_free: int, best_node: str | None, requested: int) -> Refusal:
    where = f" (node {best_node})" if best_node else ""
    return Refusal(
        reason=Reason.NO_NODE_WITH_ROOM,
        message=(
            f"class {class_name}: at most {_units(best_free)} free on one node{where}, "
            f"order of {requested} exceeds it by {requested - best_free}"
        ),
        subject=f"class {class_name}",
        limit=best_free,
        requested=requested,
    )


def no_node_for_set(subject: str, *, needs: str, candidates: int) -> Refusal:
    considered = "1 node" if candidates == 1 else f"{candidates} nodes"
    return Refusal(
        reason=Reason.NO_NODE_WITH_ROOM,
        message=f"{subject}: no eligible node has room for {needs} ({considered} considered)",
        subject=subject,
    )


def vm_runs_on(subject: str, *, node: str | None, why: Refusal | None) -> Refusal:
    """A set whose VM runs may go to its launcher's node only (R-BIND-7), and that node cannot take it."""
    if node is None:
        return Refusal(
            reason=Reason.NO_NODE_WITH_ROOM,
            message=f"{subject}: its VM has a launcher pod on no node yet, and a set whose VM runs goes nowhere else",
            subject=subject,
        )
    because = f": {why.message}" if why is not None else ""
    return Refusal(
        reason=why.reason if why is not None else Reason.NO_NODE_WITH_ROOM,
        message=f"{subject}: its VM runs on node {node}, the only node the set may go to, and it cannot take the "
                f"set{because}",
        subject=subject,
        limit=why.limit if why is not None else None,
        in_use=why.in_use if why is not None else None,
    )


def unknown_device(namespace: str, name: str) -> Refusal:
    return Refusal(
        reason=Reason.UNKNOWN_DEVICE,
        message=f"GPUDevice {namespace}/{name} does not exist",
        subject=f"GPUDevice {namespace}/{name}",
    )


def node_refusal(reason: Reason, node: str, detail: str) -> Refusal:
    """A node that cannot take or keep a set; ``detail`` says which condition, taint or selector."""
    return Refusal(reason=reason, message=f"node {node}: {detail}", subject=f"node {node}")


def capacity_lost(node: str, *, resource_name: str, served: int, in_use: int) -> Refusal:
    return Refusal(
        reason=Reason.CAPACITY_LOST,
        message=(
            f"node {node}: serves {_units(served)} of {resource_name} but {in_use} are held or in use, "
            f"{in_use - served} too many"
        ),
        subject=f"node {node}",
        limit=served,
        in_use=in_use,
    )


def over_limit(subject: str, what: str, *, limit: int, found: int, unit: str = "entries") -> Refusal:
    """A request that carries more than admission reads: ``what`` of ``subject`` has ``found`` ``unit``."""
    return Refusal(
        reason=Reason.OVER_LIMIT,
        message=f"{subject}: {what}: {found} {unit}, at most {limit}",
        subject=subject,
        limit=limit,
        requested=found,
    )
