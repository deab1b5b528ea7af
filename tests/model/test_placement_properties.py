"""Properties of a binder pass over random clusters: what no plan may ever do."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.model.placement import FAILED, Answer, Bind, MarkLost, Stay, _Planner, plan_pass, resulting_states
from cozygpu.model.snapshot import OnCordon, Phase, Snapshot
from tests.model.factories import NOW, device, gpu_class, inventory, node, pod, snapshot

H100 = "nvidia.com/H100"
A10 = "nvidia.com/A10"
NODES = ["n0", "n1", "n2", "n3"]
TENANTS = ["tenant-a", "tenant-a-b", "tenant-c"]


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    nodes = []
    inventories = []
    for name in NODES[: draw(st.integers(min_value=1, max_value=len(NODES)))]:
        nodes.append(node(name, ready=draw(st.booleans()) or draw(st.booleans()), unschedulable=draw(st.booleans())))
        stale = draw(st.integers(min_value=0, max_value=5)) == 0
        served = {H100: draw(st.integers(min_value=0, max_value=6)), A10: draw(st.integers(min_value=0, max_value=4))}
        inventories.append(inventory(name, served, last_report=NOW - timedelta(hours=1) if stale else NOW))
    devices = []
    for i in range(draw(st.integers(min_value=0, max_value=12))):
        phase = draw(st.sampled_from([Phase.PENDING, Phase.BOUND, Phase.LOST]))
        namespace = draw(st.sampled_from(TENANTS))
        vmi_name = draw(st.sampled_from([None, "vm1", "vm2"]))
        devices.append(
            device(
                f"d{i}",
                namespace=namespace,
                cls=draw(st.sampled_from(["h100", "a10"])),
                count=draw(st.integers(min_value=1, max_value=3)),
                phase=phase,
                node=draw(st.sampled_from([*NODES, "gone"])) if phase is Phase.BOUND else None,
                vmi=vmi_name,
                request="r" if vmi_name and draw(st.booleans()) else None,
                created=NOW - timedelta(seconds=i),
            )
        )
    pods = [
        pod(f"raw{i}", node_name=draw(st.sampled_from(NODES)), requests={H100: draw(st.integers(1, 2))})
        for i in range(draw(st.integers(min_value=0, max_value=2)))
    ]
    quotas: dict[str, dict[str, object]] = {}
    for tenant in ["tenant-a", "tenant-c", "tenant-root"]:
        if draw(st.booleans()):
            quotas[tenant] = {"requests.gpu.cozystack.io/total": str(draw(st.integers(min_value=0, max_value=8)))}
    classes = [
        gpu_class("h100", resource=H100, on_cordon=draw(st.sampled_from(list(OnCordon)))),
        gpu_class("a10", resource=A10),
    ]
    return snapshot(classes=classes, nodes=nodes, inventories=inventories, devices=devices, pods=pods, quotas=quotas)


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_a_set_is_never_left_split_by_a_pass_but_one_whose_start_it_refused(snap: Snapshot) -> None:
    plan = plan_pass(snap)
    states = resulting_states(snap, plan)
    refused = {a.device for a in plan.of(Answer) if a.result == FAILED}
    for members in snap.devices_by_vmi.values():
        accepted = [states[k] for k in members if states[k][0] is not Phase.PENDING]
        if refused & set(members):  # the webhook refuses the start and takes the attachments back
            continue
        assert len(set(accepted)) <= 1, accepted


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_no_placement_exceeds_a_nodes_free_units(snap: Snapshot) -> None:
    plan = plan_pass(snap)
    states = resulting_states(snap, plan)
    held: defaultdict[tuple[str, str], int] = defaultdict(int)
    for key, (phase, where) in states.items():
        if phase is Phase.BOUND and where:
            held[(where, snap.classes[snap.devices[key].class_name].resource_name)] += snap.devices[key].count
    for action in plan.of(Bind):
        name = snap.classes[snap.devices[action.device].class_name].resource_name
        entry = snap.capacity[action.node][name]
        assert entry.fresh
        assert held[(action.node, name)] + entry.raw_in_use <= entry.served
        assert snap.nodes[action.node].ready


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_no_order_a_pass_accepts_breaks_a_budget(snap: Snapshot) -> None:
    states = resulting_states(snap, plan_pass(snap))
    before: defaultdict[str, int] = defaultdict(int)
    after: defaultdict[str, int] = defaultdict(int)
    for key, device_ in snap.devices.items():
        for tenant in snap.budgets:
            if device_.namespace == tenant or device_.namespace.startswith(f"{tenant}-") or tenant == "tenant-root":
                if device_.accepted:
                    before[tenant] += device_.count
                if states[key][0] is not Phase.PENDING:
                    after[tenant] += device_.count
    for tenant, declared in snap.budgets.items():
        assert declared.total is not None
        assert declared.total.amount is not None
        assert after[tenant] <= max(declared.total.amount, before[tenant])


@settings(max_examples=300, deadline=None)
@given(clusters(), st.booleans())
def test_a_set_said_to_stay_is_not_moved_by_the_same_plan(snap: Snapshot, answers_only: bool) -> None:
    plan = plan_pass(snap, answers_only=answers_only)
    stayed = {key: stay for stay in plan.of(Stay) for key in stay.devices}
    for action in plan.actions:
        if isinstance(action, Bind | MarkLost):
            assert action.device not in stayed, (action, stayed[action.device])


@settings(max_examples=300, deadline=None)
@given(
    clusters(),
    st.lists(st.tuples(st.sampled_from(NODES), st.sampled_from([H100, A10]), st.integers(-3, 3)), max_size=12),
    st.sampled_from([H100, A10]),
    st.integers(min_value=1, max_value=6),
    st.sets(st.sampled_from(NODES)),
    st.sets(st.sampled_from(NODES)),
)
def test_the_room_buckets_find_the_node_a_walk_over_every_node_finds(
    cluster: Snapshot, bookings: list[tuple[str, str, int]], name: str, units: int,
    candidates: set[str], skip: set[str],
) -> None:
    """R-BIND-5's fullest node with room (ties by name), from the buckets, after this pass's bookings."""
    planner = _Planner(cluster)
    booked: defaultdict[str, int] = defaultdict(int)
    for node_name, resource, n in bookings:
        planner.state.units.book(node_name, resource, n)
        entry = cluster.capacity.get(node_name, {}).get(resource)
        if resource == name and entry is not None and entry.fresh:
            booked[node_name] -= n

    def free(node_name: str) -> int:
        entry = cluster.capacity.get(node_name, {}).get(name)
        return entry.room + booked[node_name] if entry is not None and entry.fresh else 0

    fits = sorted((free(n) - units, n) for n in NODES if n in candidates and n not in skip and free(n) >= units)
    assert planner.state.units.fullest(name, units, candidates, skip) == (fits[0][1] if fits else None)
    assert planner.state.units.max_free(name) == max([0, *(free(n) for n in NODES)])
