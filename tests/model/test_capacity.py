from __future__ import annotations

from datetime import timedelta

from cozygpu.model.capacity import capacity_problem, free_for_binds, report_fresh, served_units
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import Phase, PodPhase
from tests.model.factories import A10_Q, H100, NOW, device, gpu_class, inventory, node, pod, snapshot


def test_an_mdev_parent_serves_all_of_its_allocatable_slots() -> None:
    entries = [(A10_Q, 4), (A10_Q, 2), (H100, 1), (H100, 0), ("", 3)]
    assert served_units(entries) == {A10_Q: 6, H100: 1}


def test_free_units_subtract_bound_devices_and_uncovered_raw_pods_on_the_node() -> None:
    snap = snapshot(
        devices=[
            device("bound", count=3, phase=Phase.BOUND, node="n1"),
            device("lost", count=2, phase=Phase.LOST),
            device("pending", count=2),
        ],
        pods=[
            pod("raw", requests={H100: 1}),
            pod("finished", requests={H100: 4}, phase=PodPhase.FAILED),
            pod("elsewhere", node_name="n2", requests={H100: 1}),
        ],
    )
    entry = snap.capacity["n1"][H100]
    assert (entry.served, entry.held, entry.raw_in_use, entry.free) == (8, 3, 1, 4)


def test_a_stale_report_is_unknown_never_free_and_never_capacity_lost() -> None:
    stale = inventory("n1", {H100: 8}, last_report=NOW - timedelta(hours=1))
    snap = snapshot(
        nodes=[node("n1")],
        inventories=[stale],
        devices=[device("d", count=8, phase=Phase.BOUND, node="n1")],
    )
    entry = snap.capacity["n1"][H100]
    assert not entry.fresh
    assert free_for_binds(entry) == 0
    assert capacity_problem(entry) is None
    assert snap.availability["h100"].free_in_cluster == 0


def test_a_report_without_a_time_is_not_fresh() -> None:
    assert not report_fresh(None, now=NOW, stale_after=timedelta(minutes=5))
    assert report_fresh(NOW - timedelta(minutes=5), now=NOW, stale_after=timedelta(minutes=5))


def test_capacity_is_lost_when_a_fresh_report_serves_fewer_units_than_are_held() -> None:
    snap = snapshot(
        nodes=[node("n1")],
        inventories=[inventory("n1", {H100: 2})],
        devices=[device("d", count=3, phase=Phase.BOUND, node="n1")],
    )
    problem = capacity_problem(snap.capacity["n1"][H100])
    assert problem is not None
    assert problem.reason is Reason.CAPACITY_LOST
    assert problem.message == f"node n1: serves 2 units of {H100} but 3 are held or in use, 1 too many"


def test_two_classes_of_one_resource_name_share_the_nodes_units() -> None:
    snap = snapshot(
        classes=[gpu_class("h100"), gpu_class("h100-big", resource=H100)],
        devices=[device("d", cls="h100-big", count=5, phase=Phase.BOUND, node="n1")],
    )
    assert snap.availability["h100"].free_in_cluster == 3
    assert snap.availability["h100-big"].free_in_cluster == 3
