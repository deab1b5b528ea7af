from __future__ import annotations

from cozygpu.model.snapshot import Phase
from tests.model.factories import H100, device, gpu_class, gpu_nodes, namespaces, snapshot


def test_devices_are_indexed_by_node_and_vmi() -> None:
    snap = snapshot(
        classes=[gpu_class("h100"), gpu_class("a10", resource="nvidia.com/A10")],
        devices=[
            device("a", phase=Phase.BOUND, node="n1", vmi="vm1"),
            device("b", namespace="tenant-b", cls="a10"),
            device("c", phase=Phase.LOST, vmi="vm1"),
        ],
    )
    assert snap.devices_by_node == {"n1": (("tenant-a", "a"),)}
    assert snap.devices_by_vmi == {("tenant-a", "vm1"): (("tenant-a", "a"), ("tenant-a", "c"))}


def test_subtree_usage_adds_each_namespace_to_every_ancestor_and_only_accepted_devices_count() -> None:
    snap = snapshot(
        devices=[
            device("a", namespace="tenant-a-b-c", count=2, phase=Phase.BOUND, node="n1"),
            device("b", namespace="tenant-a", count=1, phase=Phase.LOST),
            device("c", namespace="tenant-a-b", count=4),
            device("d", namespace="platform", count=1, phase=Phase.BOUND, node="n1"),
        ]
    )
    assert snap.usage_of("tenant-a-b-c").total == 2
    assert snap.usage_of("tenant-a-b").total == 2
    assert snap.usage_of("tenant-a").total == 3
    assert snap.usage_of("tenant-root").total == 3
    assert snap.usage_of("tenant-root").raw == {H100: 3}
    assert "platform" not in snap.subtree_usage


def test_the_tenant_tree_lists_children_of_known_namespaces() -> None:
    snap = snapshot(namespaces_=namespaces("tenant-root", "tenant-a", "tenant-b", "tenant-a-x", "kube-system"))
    assert snap.children == {"tenant-root": ("tenant-a", "tenant-b"), "tenant-a": ("tenant-a-x",)}


def test_class_availability_counts_only_nodes_eligible_for_the_class() -> None:
    nodes, inventories = gpu_nodes(("n1", 4), ("n2", 4))
    from cozygpu.model.snapshot import LabelSelector

    nodes[1] = type(nodes[1])(name="n2", labels={"gpu": "h100"})
    snap = snapshot(
        classes=[gpu_class(selector=LabelSelector(match_labels=(("gpu", "h100"),)))],
        nodes=nodes,
        inventories=inventories,
    )
    available = snap.availability["h100"]
    assert dict(available.node_free) == {"n2": 4}
    assert (available.free_in_cluster, available.best_node) == (4, "n2")
