"""Compaction in the placement run (R-BIND-11): an order no node has room for is placed where moving
stopped holds makes room, each move a Bind whose cause names the order; never a VM's hold, never a class or a
namespace that opted out."""

from __future__ import annotations

import attrs

from cozygpu import keys
from cozygpu.model.derive import ModelTables
from cozygpu.model.placement import Bind, KeepPending, PassPlan, order_check, place_set, plan_pass
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import (
    Attachment,
    CompactionPolicy,
    DeviceKey,
    DeviceView,
    NamespaceView,
    Phase,
    Snapshot,
)
from tests.model.factories import NOW, device, gpu_class, gpu_nodes, pod, snapshot, vmi

NODES = ("n0", "n1", "n2", "n3")


def fragmented(*, order: int = 4, class_policy: CompactionPolicy = CompactionPolicy.ALLOWED,
               extra: tuple[DeviceView, ...] = (), **kw: object) -> Snapshot:
    """Four 4-GPU nodes, each with three stopped single-GPU holds (one free GPU apiece), and an order of ``order``."""
    nodes, inventories = gpu_nodes(*((n, 4) for n in NODES))
    holds = [device(f"h-{n}-{j}", phase=Phase.BOUND, node=n, namespace="tenant-b") for n in NODES for j in range(3)]
    cls = attrs.evolve(gpu_class(), compaction=class_policy)
    return snapshot(classes=[cls], nodes=nodes, inventories=inventories,
                    devices=[*holds, *extra, device("big", count=order)], **kw)  # type: ignore[arg-type]


def binds(plan: PassPlan) -> list[Bind]:
    return list(plan.of(Bind))


def test_an_order_no_node_has_room_for_is_bound_after_moving_the_fewest_stopped_holds() -> None:
    plan = plan_pass(fragmented())
    made = binds(plan)
    moved, placed = made[:-1], made[-1]
    assert placed.device == ("tenant-a", "big")
    assert placed.node == "n0"
    assert len(moved) == 3
    assert {b.previous for b in moved} == {"n0"}
    assert sorted(b.node for b in moved) == ["n1", "n2", "n3"]
    for bind in moved:
        assert bind.cause is not None
        assert bind.cause.reason is Reason.COMPACTION
        assert bind.cause.message == ("compaction: room made on node n0 for GPUDevice tenant-a/big (4 units on one "
                                      "node; 3 stopped holds moved)")


def test_an_order_that_fits_somewhere_moves_nothing() -> None:
    nodes, inventories = gpu_nodes(("n0", 4), ("n1", 4))
    snap = snapshot(nodes=nodes, inventories=inventories,
                    devices=[device("h", phase=Phase.BOUND, node="n0"), device("small", count=3)])
    assert [(b.device, b.node, b.previous) for b in binds(plan_pass(snap))] == [(("tenant-a", "small"), "n0", None)]


def test_a_running_vms_hold_stays_and_the_plan_uses_only_the_stopped_ones() -> None:
    # n0's holds: one of them its VM's, running there; n1 has only stopped ones: the order goes to n1.
    running = device("h-n0-0", phase=Phase.BOUND, node="n0", namespace="tenant-b", vmi="vm", vmi_uid="u")
    nodes, inventories = gpu_nodes(("n0", 4), ("n1", 4), ("n2", 4))
    holds = [running, device("h-n0-1", phase=Phase.BOUND, node="n0", namespace="tenant-b"),
             device("h-n1-0", phase=Phase.BOUND, node="n1", namespace="tenant-b"),
             *(device(f"h-n2-{j}", phase=Phase.BOUND, node="n2", namespace="tenant-b") for j in range(2))]
    snap = snapshot(nodes=nodes, inventories=inventories, devices=[*holds, device("big", count=4)],
                    vmis=[vmi("vm", namespace="tenant-b", uid="u", active=["uid-launcher"])],
                    pods=[pod("launcher", namespace="tenant-b", node_name="n0", uid="uid-launcher",
                              claims_vmi=("tenant-b", "vm"))])
    made = binds(plan_pass(snap))
    # n0 could free 3 at most (its VM's hold stays); n1 frees 4 with one move, to the fullest node with room.
    assert [(b.device, b.previous, b.node) for b in made] == [
        (("tenant-b", "h-n1-0"), "n1", "n0"), (("tenant-a", "big"), None, "n1")]


def test_a_class_that_never_compacts_leaves_the_order_pending_with_the_old_reason() -> None:
    plan = plan_pass(fragmented(class_policy=CompactionPolicy.NEVER))
    assert binds(plan) == []
    [pending] = plan.of(KeepPending)
    assert pending.refusal.reason is Reason.NO_NODE_WITH_ROOM


def test_a_namespace_labelled_never_keeps_its_holds_where_they_are() -> None:
    opted_out = NamespaceView(name="tenant-b", labels={keys.COMPACTION_LABEL: "Never"})
    plan = plan_pass(fragmented(namespaces_=[opted_out]))
    assert binds(plan) == []


def test_the_webhooks_dry_check_says_where_and_after_how_many_moves() -> None:
    snap = fragmented()
    placement = place_set(snap, [snap.devices[("tenant-a", "big")]])
    assert placement.node == "n0"
    assert placement.compaction is not None
    assert placement.compaction.said() == "placed on n0 after moving 3 stopped holds"


def test_the_order_check_accepts_what_compaction_places_and_refuses_the_rest_with_the_numbers() -> None:
    snap = fragmented()
    placed = order_check(snap, "tenant-a", "h100", 4, label="big-2")
    assert placed.refusal is None
    assert placed.compaction is not None
    assert placed.compaction.said() == "placed on n0 after moving 3 stopped holds"
    refused = order_check(snap, "tenant-a", "h100", 5, label="bigger")
    assert refused.refusal is not None
    assert refused.refusal.message == "class h100: 4 units free in the cluster, order of 5 exceeds it by 1"
    # Five nodes, each with two GPUs its VM's holds use and one stopped hold: five free, at most two on a node.
    nodes, inventories = gpu_nodes(*((f"m{i}", 4) for i in range(5)))
    holds = [device(f"vm-{i}-{j}", phase=Phase.BOUND, node=f"m{i}", namespace="tenant-b", vmi=f"vm-{i}")
             for i in range(5) for j in range(2)]
    holds += [device(f"stopped-{i}", phase=Phase.BOUND, node=f"m{i}", namespace="tenant-b") for i in range(5)]
    pinned = snapshot(nodes=nodes, inventories=inventories, devices=holds)
    short = order_check(pinned, "tenant-a", "h100", 4, label="big-3")
    assert short.refusal is not None
    assert short.refusal.message == (
        "class h100: 5 units free in the cluster, at most 2 units on one node (node m0) even after moving every "
        "stopped hold that may move, order of 4 exceeds it by 2")


def test_the_stopped_hold_sizes_kept_by_updates_are_the_ones_built_from_scratch() -> None:
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 8))
    current = {d.key: d for d in (device("h1", phase=Phase.BOUND, node="n1"),
                                  device("h2", phase=Phase.BOUND, node="n1", count=2),
                                  device("h3", phase=Phase.BOUND, node="n2", vmi="vm"))}
    live = ModelTables()
    live.rebuild(now=NOW, classes=[gpu_class()], devices=current.values(), nodes=nodes, inventories=inventories,
                 pods=[], vmis=[], namespaces=[])
    changes: list[tuple[DeviceKey, DeviceView | None]] = [
        (("tenant-a", "h1"), attrs.evolve(current[("tenant-a", "h1")], attachment=Attachment(vmi="vm"))),
        (("tenant-a", "h2"), None),
        (("tenant-a", "h4"), device("h4", phase=Phase.BOUND, node="n2", count=3)),
        (("tenant-a", "h3"), attrs.evolve(current[("tenant-a", "h3")], attachment=None)),
        (("tenant-a", "h4"), attrs.evolve(device("h4", phase=Phase.BOUND, node="n2", count=3), deleting=True)),
    ]
    for key, view in changes:
        updated = live.update(now=NOW, devices={key: view})
        if view is None:
            current.pop(key)
        else:
            current[key] = view
        fresh = snapshot(nodes=nodes, inventories=inventories, devices=current.values())
        assert dict(updated.stopped_hold_sizes) == dict(fresh.stopped_hold_sizes), f"after {key} -> {view}"
    assert dict(updated.stopped_hold_sizes) == {"h100": ((1, 1),)}  # h3, detached; h1 attached, h4 deleting


def test_a_vm_starts_template_order_that_no_node_has_room_for_is_placed_by_compaction_in_the_dry_check() -> None:
    # The VMI webhook's dry check of a start whose template device is an order of 4 (R-BIND-11): the answer says
    # where, after how many moves, as the binder's answer to its bind request will.
    snap = fragmented(order=1)
    template = DeviceView(namespace="tenant-a", name="vm-big-gpus", class_name="h100", count=4, template=True,
                          created=NOW)
    placement = place_set(snap, [template], vmi=vmi("vm-big"), count_pending=True)
    assert placement.refusal is None
    assert placement.compaction is not None
    assert placement.compaction.said() == "placed on n0 after moving 3 stopped holds"
    assert [b.device for b in placement.moves[:3]] == [("tenant-b", f"h-n0-{j}") for j in range(3)]
    assert placement.moves[3].device == ("tenant-a", "vm-big-gpus")


def test_a_hold_is_never_moved_onto_a_node_it_could_not_stay_on() -> None:
    # n1 is cordoned with all four GPUs free: no hold may go there, so n0's three holds have nowhere to go.
    nodes, inventories = gpu_nodes(("n0", 4), ("n1", 4), ("n2", 4))
    nodes[1] = attrs.evolve(nodes[1], unschedulable=True)
    holds = [device(f"h-{n}-{j}", phase=Phase.BOUND, node=n, namespace="tenant-b") for n in ("n0", "n2")
             for j in range(3)]
    plan = plan_pass(snapshot(nodes=nodes, inventories=inventories, devices=[*holds, device("big", count=4)]))
    assert binds(plan) == []
    nodes[1] = attrs.evolve(nodes[1], unschedulable=False)
    uncordoned = plan_pass(snapshot(nodes=nodes, inventories=inventories, devices=[*holds, device("big", count=4)]))
    assert [b.node for b in binds(uncordoned)] == ["n1"], "with n1 open the order simply fits there"
