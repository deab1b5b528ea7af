"""The placement module's promise, over random clusters: one answer for a request, whoever asks.

The VMI webhook's dry check (``place_set``), the answer pass and a full pass
must answer a bind request alike (R-BIND-3, R-BIND-6, R-ADM-2). The answer
pass and the full pass may legitimately differ where something earlier in
the same plan changed what the request depends on: units of a resource name
its set needs (a Bind or a MarkLost of another device of that name), a
budget over its namespace (an order accepted under a shared budgeted
ancestor), or its own devices (a move the full pass made first). A ``Stay``
moves nothing, so it never excuses a difference: it is part of the answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta

from hypothesis import given, note, settings
from hypothesis import strategies as st

from cozygpu.model.placement import (
    FAILED,
    SUCCEEDED,
    Action,
    Answer,
    Bind,
    DeviceSet,
    KeepPending,
    MarkLost,
    PassPlan,
    Stay,
    device_sets,
    place_set,
    plan_pass,
)
from cozygpu.model.snapshot import DeviceKey, LabelSelector, OnCordon, Phase, Snapshot, Taint, Toleration
from cozygpu.model.tenants import ancestry
from tests.model.factories import NOW, device, gpu_class, inventory, node, pod, snapshot, vmi

H100 = "nvidia.com/H100"
A10 = "nvidia.com/A10"
NODES = ["n0", "n1", "n2", "n3"]
TENANTS = ["tenant-a", "tenant-a-b", "tenant-c"]
VMIS = ["vm1", "vm2", "vm3"]
DEDICATED = Taint(key="dedicated", value="gpu", effect="NoSchedule")
ZONE = "zone"

#: The promise is cheap to check; a few hundred clusters a run, the same ones every run.
PROMISE = settings(max_examples=400, deadline=None, derandomize=True)


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    """Nodes (ready, cordoned, tainted, zoned, stale), two classes, VMIs, budgets up a tenant tree, devices."""
    nodes = []
    inventories = []
    for name in NODES[: draw(st.integers(min_value=1, max_value=len(NODES)))]:
        nodes.append(
            node(
                name,
                ready=draw(st.integers(min_value=0, max_value=5)) > 0,
                unschedulable=draw(st.booleans()),
                taints=(DEDICATED,) if draw(st.integers(min_value=0, max_value=3)) == 0 else (),
                labels={ZONE: draw(st.sampled_from(["a", "b"]))},
            )
        )
        stale = draw(st.integers(min_value=0, max_value=7)) == 0
        served = {H100: draw(st.integers(min_value=0, max_value=6)), A10: draw(st.integers(min_value=0, max_value=4))}
        inventories.append(inventory(name, served, last_report=NOW - timedelta(hours=1) if stale else NOW))
    classes = [
        gpu_class(
            "h100",
            resource=H100,
            on_cordon=draw(st.sampled_from(list(OnCordon))),
            selector=LabelSelector(match_labels=((ZONE, "a"),)) if draw(st.booleans()) else None,
        ),
        gpu_class(
            "a10",
            resource=A10,
            on_cordon=draw(st.sampled_from(list(OnCordon))),
            tolerations=(Toleration(key="dedicated", operator="Exists"),) if draw(st.booleans()) else (),
        ),
    ]
    devices = []
    for i in range(draw(st.integers(min_value=0, max_value=9))):
        phase = draw(st.sampled_from([Phase.PENDING, Phase.BOUND, Phase.BOUND, Phase.LOST]))
        vmi_name = draw(st.sampled_from([None, *VMIS]))
        devices.append(
            device(
                f"d{i}",
                namespace=draw(st.sampled_from(TENANTS)),
                cls=draw(st.sampled_from(["h100", "a10"])),
                count=draw(st.integers(min_value=1, max_value=3)),
                phase=phase,
                node=draw(st.sampled_from([*NODES, "gone"])) if phase is Phase.BOUND else None,
                vmi=vmi_name,
                request="r1" if vmi_name and draw(st.booleans()) else None,
                created=NOW - timedelta(seconds=i),
            )
        )
    vmis = []
    pods = []
    for tenant in TENANTS:
        for name in VMIS:
            if not draw(st.booleans()):
                continue
            running = draw(st.booleans())
            uid = f"launcher-{tenant}-{name}"
            vmis.append(
                vmi(
                    name,
                    namespace=tenant,
                    active=[uid] if running else [],
                    tolerations=(Toleration(key="dedicated", operator="Exists"),) if draw(st.booleans()) else (),
                    node_selector={ZONE: "b"} if draw(st.integers(min_value=0, max_value=3)) == 0 else None,
                )
            )
            if running:
                where = draw(st.sampled_from(NODES))
                pods.append(pod(f"virt-launcher-{name}", namespace=tenant, uid=uid, node_name=where))
    quotas: dict[str, dict[str, object]] = {}
    for tenant in ["tenant-root", "tenant-a", "tenant-c"]:
        if draw(st.booleans()):
            key = draw(st.sampled_from(["gpu.cozystack.io/total", "gpu.cozystack.io/h100", "gpu.cozystack.io/a10"]))
            quotas[tenant] = {f"requests.{key}": str(draw(st.integers(min_value=0, max_value=8)))}
    return snapshot(
        classes=classes, nodes=nodes, inventories=inventories, devices=devices, pods=pods, vmis=vmis, quotas=quotas
    )


def describe(snap: Snapshot) -> str:
    """The cluster in a few lines, for a failing example (the Snapshot's repr runs to pages)."""
    lines = []
    for name, view in sorted(snap.nodes.items()):
        served = {n: e.served for n, e in snap.capacity.get(name, {}).items()}
        fresh = all(e.fresh for e in snap.capacity.get(name, {}).values())
        flags = [
            f
            for f, on in (
                ("not-ready", not view.ready),
                ("cordoned", view.unschedulable),
                ("tainted", bool(view.taints)),
                ("stale", not fresh),
            )
            if on
        ]
        lines.append(f"node {name} {dict(view.labels)} serves {served} {' '.join(flags)}")
    for c in snap.classes.values():
        lines.append(f"class {c.name} onCordon={c.on_cordon.value} selector={c.node_selector} tol={c.tolerations}")
    for (ns, name), d in sorted(snap.devices.items()):
        vmi_name = d.attachment.vmi if d.attachment else "-"
        asked = "asks" if d.unanswered_request else ""
        lines.append(
            f"device {ns}/{name} {d.class_name}x{d.count} {d.phase.value} {d.node_name} vmi={vmi_name} {asked}"
        )
    for key, v in sorted(snap.vmis.items()):
        lines.append(f"vmi {key} running={bool(v.active_pods)} tol={bool(v.tolerations)} selector={v.node_selector}")
    lines.extend(f"budget {t}: {b}" for t, b in sorted(snap.budgets.items()))
    return "\n".join(lines)


# -- what a plan says to one request ------------------------------------------------


def requested_sets(snap: Snapshot) -> list[DeviceSet]:
    return [s for s in device_sets(snap) if any(snap.devices[k].unanswered_request for k in s.members)]


def outcome_in(plan: PassPlan, members: Iterable[DeviceKey]) -> tuple[object, ...]:
    """What ``plan`` tells a request of the set: its answers, the Stay, the moves, the orders left Pending."""
    keys = set(members)
    answers = sorted(
        ((a.device, a.result, a.node, a.refusal) for a in plan.of(Answer) if a.device in keys), key=lambda a: a[0]
    )
    stays = {(s.devices, s.node, s.why, s.cause) for s in plan.of(Stay) if keys & set(s.devices)}
    moves = sorted(((b.device, b.node, b.previous, b.cause) for b in plan.of(Bind) if b.device in keys), key=str)
    waiting = sorted(((k.device, k.refusal) for k in plan.of(KeepPending) if k.device in keys), key=str)
    return tuple(answers), stays, tuple(moves), tuple(waiting)


def dry_outcome(snap: Snapshot, device_set: DeviceSet) -> tuple[object, ...]:
    """The same four things from the webhook's dry check of the set."""
    members = [snap.devices[k] for k in device_set.members]
    vmi_view = snap.vmis.get(device_set.vmi) if device_set.vmi is not None else None
    placement = place_set(snap, members, vmi=vmi_view, label=device_set.label)
    result = SUCCEEDED if placement.refusal is None else FAILED
    answers = sorted(
        ((d.key, result, placement.node, placement.refusal) for d in members if d.unanswered_request),
        key=lambda a: a[0],
    )
    stay = placement.stay
    stays = {(stay.devices, stay.node, stay.why, stay.cause)} if stay is not None else set()
    moves = sorted(((b.device, b.node, b.previous, b.cause) for b in placement.moves), key=str)
    waiting = (
        sorted(((d.key, placement.refusal) for d in members if d.phase is Phase.PENDING and not d.deleting), key=str)
        if placement.refusal is not None
        else []
    )
    return tuple(answers), stays, tuple(moves), tuple(waiting)


def before_answer(plan: PassPlan, members: Iterable[DeviceKey]) -> Sequence[Action]:
    keys = set(members)
    for index, action in enumerate(plan.actions):
        if isinstance(action, Answer) and action.device in keys:
            return plan.actions[:index]
    raise AssertionError(f"no answer for {sorted(keys)}")


def own_moves(plan: PassPlan, device_set: DeviceSet) -> list[Bind]:
    return [b for b in plan.of(Bind) if b.device in device_set.members]


def changes_what_it_depends_on(
    snap: Snapshot, device_set: DeviceSet, earlier: Sequence[Action], *, own: Iterable[Bind]
) -> bool:
    """Whether an earlier Bind or MarkLost changed units, budgets or devices the set's answer reads.

    ``own`` are the set's own moves as the answer pass made them in answering
    it: those, even made first by a full pass, change nothing the answer reads
    (whatever cause the full pass gives them: the outcomes compare causes).
    """
    keys = set(device_set.members)
    names = {snap.classes[snap.devices[k].class_name].resource_name for k in keys}
    namespaces = {k[0] for k in keys}
    budgeted = {tenant for tenant, budget in snap.budgets.items() if budget.declares_gpu_key}
    over_set = {t for ns in namespaces for t in ancestry(ns)} & budgeted
    allowed = {(b.device, b.node, b.previous) for b in own}
    for action in earlier:
        if isinstance(action, Bind) and (action.device, action.node, action.previous) in allowed:
            continue
        if not isinstance(action, Bind | MarkLost):
            continue
        if action.device in keys:
            return True
        other = snap.devices[action.device]
        if snap.classes[other.class_name].resource_name in names:
            return True
        accepting = isinstance(action, Bind) and other.phase is Phase.PENDING
        if accepting and set(ancestry(other.namespace)) & over_set:
            return True
    return False


@PROMISE
@given(clusters())
def test_the_dry_check_and_the_answer_pass_give_a_request_the_same_answer(snap: Snapshot) -> None:
    note(describe(snap))
    answers = plan_pass(snap, answers_only=True)
    for device_set in requested_sets(snap):
        earlier = before_answer(answers, device_set.members)
        if changes_what_it_depends_on(snap, device_set, earlier, own=own_moves(answers, device_set)):
            continue
        assert outcome_in(answers, device_set.members) == dry_outcome(snap, device_set), device_set.label


@PROMISE
@given(clusters())
def test_a_full_pass_gives_the_answer_pass_answer_where_nothing_before_it_changed_what_it_reads(
    snap: Snapshot,
) -> None:
    note(describe(snap))
    answers = plan_pass(snap, answers_only=True)
    full = plan_pass(snap)
    for device_set in requested_sets(snap):
        own = own_moves(answers, device_set)
        if changes_what_it_depends_on(snap, device_set, before_answer(full, device_set.members), own=own):
            continue
        if changes_what_it_depends_on(snap, device_set, before_answer(answers, device_set.members), own=own):
            continue
        assert outcome_in(full, device_set.members) == outcome_in(answers, device_set.members), device_set.label


def test_a_request_first_in_its_pass_is_always_checked() -> None:
    # The guard above must not excuse everything: the set's own moves are no reason to skip it.
    snap = snapshot(devices=[device("d", count=1, vmi="vm1", request="r1")], vmis=[vmi("vm1")])
    answers = plan_pass(snap, answers_only=True)
    (device_set,) = requested_sets(snap)
    earlier = before_answer(answers, device_set.members)
    assert earlier
    assert not changes_what_it_depends_on(snap, device_set, earlier, own=own_moves(answers, device_set))
    assert outcome_in(answers, device_set.members) == dry_outcome(snap, device_set)
