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
from collections.abc import Iterable, Sequence
from datetime import datetime

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
    #: Why a stopped hold moved: to make room for an order no node had room for (R-BIND-11).
    COMPACTION = "Compaction"
    UNKNOWN_DEVICE = "UnknownDevice"
    HOLD_RELEASED = "HoldReleased"
    # Why a node cannot take (or keep) a set (R-MOD-8, R-BIND-5).
    NODE_GONE = "NodeGone"
    NODE_CORDONED = "NodeCordoned"
    NODE_NOT_READY = "NodeNotReady"
    TAINT_NOT_TOLERATED = "TaintNotTolerated"
    NODE_SELECTOR_MISMATCH = "NodeSelectorMismatch"
    REPORT_STALE = "ReportStale"
    CAPACITY_LOST = "CapacityLost"
    #: A DRA hold's claim cannot name its devices on its node: fewer are free there than it holds.
    DEVICES_SHORT = "DevicesShort"
    # A request carrying more than admission reads (issue 22): a list, a string, a count, JSON nesting.
    OVER_LIMIT = "OverLimit"
    # The webhooks' own (R-ADM-1…5): what a GPUDevice, a VMI start or a launcher pod is refused for besides
    # the order checks above. ``Refused`` is a VMI start refused for what the VMI itself says (no name, a name
    # taken, a template device's name taken or ordering something else, no spec.domain).
    REFUSED = "Refused"
    INVALID = "Invalid"
    INVALID_DEVICE_REFS = "InvalidDeviceRefs"
    DEVICE_ATTACHED = "DeviceAttached"
    DEVICE_DELETING = "DeviceDeleting"
    DEVICE_GONE = "DeviceGone"
    RAW_GPU_NAME = "RawGPUName"
    CONFLICT = "Conflict"
    TEMPLATE_REFUSED = "TemplateRefused"
    ATTACH_REFUSED = "AttachRefused"
    BIND_TIMEOUT = "BindTimeout"
    #: A VM start of a DRA-held device whose claim did not show its allocation on the device's node in time.
    CLAIM_NOT_ALLOCATED = "ClaimNotAllocated"
    #: A VM start of a DRA-held device on a cluster that serves no resource.k8s.io/v1 ResourceClaims.
    DRA_NOT_SERVED = "DRANotServed"
    #: The binder's answer is not Succeeded and carries no reason this model knows.
    BIND_FAILED = "BindFailed"
    SPLIT_SET = "SplitSet"
    NO_VMI = "NoVMI"
    NOT_ATTACHED = "NotAttached"
    NOT_BOUND = "NotBound"


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


def no_node_with_room(class_name: str, *, best_free: int, best_node: str | None, requested: int,
                      together: str = "") -> Refusal:
    """``together``: the attribute a DRA class's set must share (``matchAttribute``): what counts as free
    on a node is then its largest group of free GPUs with one value of it."""
    where = f" (node {best_node})" if best_node else ""
    sharing = f" sharing one {together}" if together else ""
    return Refusal(
        reason=Reason.NO_NODE_WITH_ROOM,
        message=(
            f"class {class_name}: at most {_units(best_free)}{sharing} free on one node{where}, "
            f"order of {requested} exceeds it by {requested - best_free}"
        ),
        subject=f"class {class_name}",
        limit=best_free,
        requested=requested,
    )


def compaction(order: str, *, node: str, needs: int, moves: int) -> Refusal:
    """Why a stopped hold moved off ``node``: room for ``order`` (R-BIND-11); a Moved Event's cause."""
    return Refusal(
        reason=Reason.COMPACTION,
        message=f"compaction: room made on node {node} for {order} ({_units(needs)} on one node; "
                f"{moves} stopped hold{'s' if moves != 1 else ''} moved)",
        subject=order,
        requested=needs,
    )


def no_node_even_after_compaction(class_name: str, *, free_in_cluster: int, best_free: int, best_node: str | None,
                                  requested: int) -> Refusal:
    """No plan of moves of stopped holds makes room for an order on one node (R-BIND-11)."""
    where = f" (node {best_node})" if best_node else ""
    return Refusal(
        reason=Reason.NO_NODE_WITH_ROOM,
        message=(
            f"class {class_name}: {_units(free_in_cluster)} free in the cluster, at most {_units(best_free)} on "
            f"one node{where} even after moving every stopped hold that may move, order of {requested} exceeds "
            f"it by {requested - best_free}"
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


def hold_released(namespace: str, name: str, class_name: str) -> Refusal:
    """A start names a device whose hold expired (R-LEDGER-2): it holds nothing and is never placed again."""
    return Refusal(
        reason=Reason.HOLD_RELEASED,
        message=f"GPUDevice {namespace}/{name} was released after sitting idle past class {class_name}'s "
                f"idleHoldLimit and holds no GPUs: order again (a new GPUDevice) and start the VM with that",
        subject=f"GPUDevice {namespace}/{name}",
    )


def node_refusal(reason: Reason, node: str, detail: str) -> Refusal:
    """A node that cannot take or keep a set; ``detail`` says which condition, taint or selector."""
    return Refusal(reason=reason, message=f"node {node}: {detail}", subject=f"node {node}")


def report_stale(node: str) -> Refusal:
    """A node whose agent report is stale: its units count as unknown until the next one."""
    return node_refusal(Reason.REPORT_STALE, node, "the agent's report is stale, its units count as unknown")


def devices_short(node: str, *, device: str, requested: int, free: int, match_attribute: str = "") -> Refusal:
    """A DRA hold whose claim cannot be allocated on its node (SPEC §1.5): someone else's claim took one of
    its devices since it was placed, or no group sharing ``match_attribute`` is large enough."""
    keep = f" sharing {match_attribute}" if match_attribute else ""
    return Refusal(
        reason=Reason.DEVICES_SHORT,
        message=(f"node {node}: GPUDevice {device} holds {requested} device(s){keep} there and "
                 f"{free} are free for its claim"),
        subject=f"node {node}",
        limit=free,
        requested=requested,
    )


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


def json_too_deep(subject: str, *, limit: int, problem: str) -> Refusal:
    """A body nested past the parser's depth, refused unparsed; ``problem`` is the parser's own words."""
    return Refusal(
        reason=Reason.OVER_LIMIT,
        message=f"{subject}: the body is JSON nested deeper than {limit} levels, the most read ({problem})",
        subject=subject,
        limit=limit,
    )


# -- the webhooks' own refusals (R-ADM-1…5) -------------------------------------------------------------------
#
# ``subject`` and the names below are what admission read from the request, cut short (``bounds.clip``) where
# they are not yet known to fit a Kubernetes name; ``problem`` is another component's own words (a parser's,
# the API server's), quoted as is.


def order_refused(subject: str, refusal: Refusal) -> Refusal:
    """``refusal`` of an order, told about ``subject`` (the GPUDevice): its reason and numbers kept."""
    return attrs.evolve(refusal, message=f"{subject}: {refusal.message}")


def invalid_order(subject: str) -> Refusal:
    return Refusal(
        reason=Reason.INVALID,
        message=f"{subject}: spec.className and an integer spec.count are required",
        subject=subject,
    )


def invalid_device_refs(subject: str, problem: str) -> Refusal:
    """The VMI's device-refs annotation cannot be read; ``problem`` names the entry (``admission.refs``)."""
    return Refusal(reason=Reason.INVALID_DEVICE_REFS, message=f"{subject}: {problem}", subject=subject)


def vmi_unnamed() -> Refusal:
    return Refusal(
        reason=Reason.REFUSED,
        message="a VMI with device references needs metadata.name (generateName is not resolved before admission)",
        subject="VMI",
    )


def vmi_exists(subject: str) -> Refusal:
    return Refusal(reason=Reason.REFUSED, message=f"{subject} exists already", subject=subject)


def vmi_without_domain() -> Refusal:
    return Refusal(reason=Reason.REFUSED, message="the VMI has no spec.domain", subject="VMI")


def device_deleting(namespace: str, name: str) -> Refusal:
    return Refusal(
        reason=Reason.DEVICE_DELETING,
        message=f"GPUDevice {namespace}/{name} is being deleted",
        subject=f"GPUDevice {namespace}/{name}",
    )


def device_attached(namespace: str, name: str, *, vmi: str) -> Refusal:
    """``name`` is attached to another VMI, one that exists."""
    return Refusal(
        reason=Reason.DEVICE_ATTACHED,
        message=f"GPUDevice {namespace}/{name} is attached to VMI {namespace}/{vmi}",
        subject=f"GPUDevice {namespace}/{name}",
    )


def device_attached_to_starting(namespace: str, name: str, *, vmi: str, attached_at: datetime | None) -> Refusal:
    """``name`` is attached to another VMI that does not exist yet but may still appear (the attachment grace)."""
    return Refusal(
        reason=Reason.DEVICE_ATTACHED,
        message=(
            f"GPUDevice {namespace}/{name} is attached to VMI {namespace}/{vmi}, "
            f"which is starting (attached {attached_at or 'just now'})"
        ),
        subject=f"GPUDevice {namespace}/{name}",
    )


def device_just_attached(namespace: str, name: str, *, vmi: str) -> Refusal:
    """Another VMI's start attached ``name`` between this start's decision and its write."""
    return Refusal(
        reason=Reason.DEVICE_ATTACHED,
        message=f"GPUDevice {namespace}/{name} was just attached to VMI {namespace}/{vmi}",
        subject=f"GPUDevice {namespace}/{name}",
    )


def device_deleted_meanwhile(namespace: str, name: str) -> Refusal:
    return Refusal(
        reason=Reason.DEVICE_GONE,
        message=f"GPUDevice {namespace}/{name} was deleted meanwhile",
        subject=f"GPUDevice {namespace}/{name}",
    )


def device_deleted_while_admitting(namespace: str, name: str, *, vmi: str) -> Refusal:
    return Refusal(
        reason=Reason.DEVICE_GONE,
        message=f"GPUDevice {namespace}/{name} was deleted while VMI {namespace}/{vmi} was being admitted",
        subject=f"GPUDevice {namespace}/{name}",
    )


def device_kept_changing(namespace: str, name: str, *, vmi: str) -> Refusal:
    return Refusal(
        reason=Reason.CONFLICT,
        message=f"GPUDevice {namespace}/{name} kept changing while VMI {namespace}/{vmi} was being attached; try again",
        subject=f"GPUDevice {namespace}/{name}",
    )


def attach_refused(namespace: str, name: str, *, vmi: str, problem: str) -> Refusal:
    """The API server refused the attachment write; ``problem`` is its message."""
    return Refusal(
        reason=Reason.ATTACH_REFUSED,
        message=f"attaching GPUDevice {namespace}/{name} to VMI {namespace}/{vmi} was refused: {problem}",
        subject=f"GPUDevice {namespace}/{name}",
    )


def claim_not_allocated(namespace: str, device: str, *, vmi_subject: str, node: str, seen: str,
                        wait: float) -> Refusal:
    """The binder answered a start, but the hold claim of a DRA member did not show its allocation on ``node``
    within ``wait`` (``seen``: what it showed); kube-scheduler would otherwise allocate it anywhere."""
    return Refusal(
        reason=Reason.CLAIM_NOT_ALLOCATED,
        message=(f"{vmi_subject}: ResourceClaim {namespace}/{device}, the hold of GPUDevice {namespace}/{device}, "
                 f"was not allocated on node {node} within {wait:g} s (it {seen}); nothing was kept"),
        subject=f"GPUDevice {namespace}/{device}",
    )


def dra_not_served(namespace: str, device: str, *, class_name: str, problem: str) -> Refusal:
    """A DRA member on a cluster serving no ResourceClaims: its hold cannot exist, nor a launcher use it."""
    return Refusal(
        reason=Reason.DRA_NOT_SERVED,
        message=(f"GPUDevice {namespace}/{device}: its class {class_name} takes its GPUs from a DRA driver, and the "
                 f"cluster serves no resource.k8s.io/v1 ResourceClaims ({problem})"),
        subject=f"GPUDevice {namespace}/{device}",
    )


def template_name_taken(namespace: str, name: str, *, template: str, vmi_subject: str, deleting: bool) -> Refusal:
    """A template's device name is held by a device that is not this VMI's template device, or is going."""
    state = "is being deleted" if deleting else "is not a template device of this VMI"
    return Refusal(
        reason=Reason.REFUSED,
        message=(
            f"GPUDevice {namespace}/{name} (template {template} of {vmi_subject}) {state}; "
            "try again once it is gone"
        ),
        subject=f"GPUDevice {namespace}/{name}",
    )


def template_differs(
    namespace: str, name: str, *, template: str, count: int, class_name: str, wanted_count: int, wanted_class: str
) -> Refusal:
    """This VMI's template device exists already and orders something else than the reference now says."""
    return Refusal(
        reason=Reason.REFUSED,
        message=(
            f"GPUDevice {namespace}/{name} (template {template}) orders {count} of class {class_name}, "
            f"the reference {wanted_count} of class {wanted_class}"
        ),
        subject=f"GPUDevice {namespace}/{name}",
    )


def template_order_refused(vmi_subject: str, device: str, refusal: Refusal) -> Refusal:
    """A template device still to create fails the GPUDevice webhook's check: ``refusal``'s reason and numbers."""
    return attrs.evolve(refusal, message=f"{vmi_subject}: template device {device}: {refusal.message}")


def template_taken(namespace: str, name: str, *, vmi: str) -> Refusal:
    """Creating a template device found one of its name, created by someone else since the decision."""
    return Refusal(
        reason=Reason.CONFLICT,
        message=(
            f"GPUDevice {namespace}/{name} (a template device of VMI {namespace}/{vmi}) was created by someone "
            "else meanwhile; try again"
        ),
        subject=f"GPUDevice {namespace}/{name}",
    )


def template_create_refused(namespace: str, name: str, *, vmi: str, problem: str) -> Refusal:
    """The API server (the GPUDevice webhook, a policy) refused a template device; ``problem`` is its message."""
    return Refusal(
        reason=Reason.TEMPLATE_REFUSED,
        message=f"template device {namespace}/{name} of VMI {namespace}/{vmi} was refused: {problem}",
        subject=f"GPUDevice {namespace}/{name}",
    )


def raw_gpu_names(subject: str, shown: Sequence[str], *, total: int) -> Refusal:
    """With raw names forbidden the VMI has GPU entries of its own: ``shown`` are the first of ``total``."""
    listed = ", ".join(shown)
    if total > len(shown):
        listed = f"{listed} and {total - len(shown)} more"
    return Refusal(
        reason=Reason.RAW_GPU_NAME,
        message=(
            f"{subject}: raw GPU names are forbidden here, so a GPU reaches a VM only through a GPUDevice "
            f"reference; remove {listed}"
        ),
        subject=subject,
    )


_REASONS = {str(r): r for r in Reason}


def binder_refused(subject: str, *, reason: str, message: str) -> Refusal:
    """The binder's answer (read from device status) is not Succeeded.

    Its reason is kept when it is one of ours (the binder writes no other),
    else it is ``BindFailed``: a reason read from status is never passed on
    unchecked.
    """
    text = reason or str(Reason.BIND_FAILED)
    return Refusal(
        reason=_REASONS.get(text, Reason.BIND_FAILED),
        message=f"{subject}: the binder refused: {message or text}",
        subject=subject,
    )


def answers_split(subject: str, nodes: Iterable[str]) -> Refusal:
    """The binder's answers on the set's devices name more than one node, or none."""
    return Refusal(
        reason=Reason.SPLIT_SET,
        message=f"{subject}: the binder's answers name nodes {sorted(nodes)}, not one",
        subject=subject,
    )


def bind_timeout(
    subject: str, *, wait: float, lease: str, holder: str | None = None, renewed: str | None = None,
    lease_error: str | None = None,
) -> Refusal:
    """No answer from the binder within ``wait`` seconds, with the leader's state read from its Lease."""
    if lease_error is not None:
        state = f"the leader Lease could not be read: {lease_error}"
    elif not holder:
        state = f"no replica holds Lease {lease}"
    else:
        state = f"leader {holder}, lease renewed {renewed or 'never'}"
    return Refusal(
        reason=Reason.BIND_TIMEOUT,
        message=f"{subject}: no answer from the binder within {wait:g} s ({state}); nothing was kept",
        subject=subject,
    )


def no_vmi_owner(subject: str) -> Refusal:
    return Refusal(
        reason=Reason.NO_VMI,
        message=(
            f"{subject}: no controller ownerReference to a VirtualMachineInstance, so its GPUDevices cannot be found"
        ),
        subject=subject,
    )


def not_attached(subject: str) -> Refusal:
    return Refusal(
        reason=Reason.NOT_ATTACHED, message=f"{subject}: no GPUDevice is attached to the VMI", subject=subject
    )


def not_bound(subject: str, devices: Iterable[tuple[str, str]]) -> Refusal:
    """The VMI's devices not Bound, as (name, phase)."""
    shown = ", ".join(f"{name} ({phase})" for name, phase in sorted(devices))
    return Refusal(reason=Reason.NOT_BOUND, message=f"{subject}: GPUDevices not Bound: {shown}", subject=subject)


def split_set(subject: str, nodes: Sequence[str]) -> Refusal:
    """The VMI's devices are Bound on more than one node (``nodes``, sorted)."""
    return Refusal(
        reason=Reason.SPLIT_SET,
        message=f"{subject}: its GPUDevices are Bound on {len(nodes)} nodes ({', '.join(nodes)}), not one",
        subject=subject,
    )
