from __future__ import annotations

import attrs

from cozygpu.model.catalog import catalog, catalog_entry, order_refusal
from cozygpu.model.placement import Bind, KeepPending, plan_pass
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import MediatedDevice, Mode, PermittedHostDevices, Phase
from tests.model.factories import A10_Q, H100, device, gpu_class, gpu_nodes, namespaces, snapshot


def three_nodes_snapshot(**kwargs: object) -> object:
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 4), ("n3", 2))
    return snapshot(nodes=nodes, inventories=inventories, **kwargs)  # type: ignore[arg-type]


def test_the_catalog_shows_free_units_in_the_cluster_and_on_the_best_node() -> None:
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 4), ("n3", 2))
    snap = snapshot(
        nodes=nodes,
        inventories=inventories,
        devices=[device("d1", count=6, phase=Phase.BOUND, node="n1")],
    )
    entry = catalog_entry(snap, "tenant-a", snap.classes["h100"])
    assert entry.free_in_cluster == 8
    assert entry.free_on_best_node == 4
    assert entry.best_node == "n2"
    assert entry.remaining_budget is None
    assert entry.max_count is None
    assert entry.orderable == 4


def test_the_catalog_entry_carries_the_tightest_budget_and_what_limits_it() -> None:
    snap = snapshot(
        devices=[device("d1", namespace="tenant-a-b", count=2, phase=Phase.BOUND, node="n1")],
        quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "3"}},
    )
    entry = catalog_entry(snap, "tenant-a-c", snap.classes["h100"])
    assert entry.remaining_budget == 1
    assert entry.limiting_budget is not None
    assert (entry.limiting_budget.namespace, entry.limiting_budget.key) == ("tenant-a", "gpu.cozystack.io/h100")
    assert entry.orderable == 1
    refusal = order_refusal(snap, "tenant-a-c", "h100", 2)
    assert refusal is not None
    assert refusal.reason is Reason.BUDGET_EXCEEDED
    assert (
        refusal.message == "budget gpu.cozystack.io/h100 of tenant-a: 3 allowed, 2 in use, order of 2 exceeds it by 1"
    )


def test_an_order_larger_than_any_one_node_is_refused_even_when_the_cluster_has_room() -> None:
    nodes, inventories = gpu_nodes(("n1", 2), ("n2", 2))
    snap = snapshot(nodes=nodes, inventories=inventories)
    refusal = order_refusal(snap, "tenant-a", "h100", 3)
    assert refusal is not None
    assert refusal.reason is Reason.NO_NODE_WITH_ROOM
    assert refusal.message == "class h100: at most 2 units free on one node (node n1), order of 3 exceeds it by 1"


def test_an_order_larger_than_the_clusters_free_units_says_so() -> None:
    snap = snapshot(devices=[device("d1", count=7, phase=Phase.BOUND, node="n1")])
    refusal = order_refusal(snap, "tenant-a", "h100", 2)
    assert refusal is not None
    assert refusal.reason is Reason.NO_FREE_UNITS
    assert refusal.message == "class h100: 1 unit free in the cluster, order of 2 exceeds it by 1"


def test_an_unknown_class_and_a_deleting_class_take_no_orders() -> None:
    snap = snapshot(classes=[gpu_class("h100", deleting=True)])
    unknown = order_refusal(snap, "tenant-a", "h200", 1)
    assert unknown is not None
    assert unknown.reason is Reason.UNKNOWN_CLASS
    deleting = order_refusal(snap, "tenant-a", "h100", 1)
    assert deleting is not None
    assert deleting.reason is Reason.CLASS_DELETING


def test_a_vgpu_class_needs_the_entitlement_on_the_tenant_or_an_ancestor_and_defaults_to_one_gpu() -> None:
    vgpu = gpu_class("a10-24q", resource=A10_Q, mode=Mode.VGPU)
    nodes, inventories = gpu_nodes(("n1", 4), resource=A10_Q)
    base = {"classes": [vgpu], "nodes": nodes, "inventories": inventories}
    refused = snapshot(**base)  # type: ignore[arg-type]
    refusal = order_refusal(refused, "tenant-a-b", "a10-24q", 1)
    assert refusal is not None
    assert refusal.reason is Reason.NOT_ENTITLED
    entitled = snapshot(namespaces_=namespaces("tenant-a", "tenant-a-b", entitled=["tenant-a"]), **base)  # type: ignore[arg-type]
    entry = catalog_entry(entitled, "tenant-a-b", vgpu)
    assert entry.entitled
    assert entry.max_count == 1
    assert order_refusal(entitled, "tenant-a-b", "a10-24q", 1) is None
    too_many = order_refusal(entitled, "tenant-a-b", "a10-24q", 2)
    assert too_many is not None
    assert too_many.reason is Reason.MAX_COUNT_EXCEEDED


def test_a_class_kubevirt_does_not_permit_is_refused_for_every_order() -> None:
    permitted = PermittedHostDevices(mediated=(MediatedDevice(selector="NVIDIA A10-24Q", resource_name=A10_Q),))
    snap = snapshot(permitted=permitted)
    refusal = order_refusal(snap, "tenant-a", "h100", 1)
    assert refusal is not None
    assert refusal.reason is Reason.CLASS_NOT_PERMITTED
    assert H100 in refusal.message


def test_the_budget_is_named_before_capacity_so_a_tenant_sees_its_own_limit_first() -> None:
    snap = snapshot(
        devices=[device("d1", count=8, phase=Phase.BOUND, node="n1")],
        quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "8"}},
    )
    refusal = order_refusal(snap, "tenant-a", "h100", 1)
    assert refusal is not None
    assert refusal.reason is Reason.BUDGET_EXCEEDED


def test_a_zero_count_order_is_refused() -> None:
    refusal = order_refusal(snapshot(), "tenant-a", "h100", 0)
    assert refusal is not None
    assert refusal.reason is Reason.INVALID_COUNT


def test_the_catalog_lists_every_class_by_name() -> None:
    snap = snapshot(classes=[gpu_class("h100"), gpu_class("a10", resource="nvidia.com/A10")])
    entries = catalog(snap, "tenant-a")
    assert [e.class_name for e in entries] == ["a10", "h100"]
    assert entries[0].free_in_cluster == 0
    assert entries[0].best_node is None


def test_orders_not_yet_accepted_count_for_the_admission_check_but_not_for_the_binder() -> None:
    # R-MOD-4: a tenant with a budget of 2 and a Pending order of 2 in its subtree cannot
    # have a second order admitted; the binder still accepts the first one.
    snap = snapshot(
        devices=[device("first", namespace="tenant-a-b", count=2)],
        quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "2"}},
    )
    refusal = order_refusal(snap, "tenant-a", "h100", 1)
    assert refusal is not None
    assert refusal.reason is Reason.BUDGET_EXCEEDED
    assert refusal.message == (
        "budget gpu.cozystack.io/h100 of tenant-a: 2 allowed, 2 in use, order of 1 exceeds it by 1"
    )
    assert catalog_entry(snap, "tenant-a", snap.classes["h100"]).orderable == 0
    assert [bind.device for bind in plan_pass(snap).of(Bind)] == [("tenant-a-b", "first")]


def test_a_pending_order_being_deleted_no_longer_holds_budget_at_admission() -> None:
    gone = attrs.evolve(device("gone", count=2), deleting=True)
    snap = snapshot(devices=[gone], quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "2"}})
    assert order_refusal(snap, "tenant-a", "h100", 2) is None


def test_the_webhook_and_the_binder_give_the_same_first_reason_for_the_same_order() -> None:
    # maxCount 2, an order of 3, and an unreadable budget: both name the count first.
    snap = snapshot(
        classes=[gpu_class("h100", max_count=2)],
        devices=[device("big", count=3)],
        quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "lots"}},
    )
    webhook = order_refusal(snap, "tenant-a", "h100", 3)
    (kept,) = plan_pass(snap).of(KeepPending)
    assert webhook is not None
    assert webhook.reason is kept.refusal.reason is Reason.MAX_COUNT_EXCEEDED
    assert webhook.message == kept.refusal.message
    # Within maxCount, the unreadable budget refuses both.
    small = order_refusal(snap, "tenant-a", "h100", 1)
    assert small is not None
    assert small.reason is Reason.BUDGET_UNREADABLE
