"""R-MOD-7's launcher window: a VM starting on its own held units never moves or loses another hold.

A launcher pod is bound to its node before virt-controller lists it in the
VMI's ``activePods`` (R-MOD-5), so for a moment its GPUs look like raw use.
A pod that *claims* the VMI (a controller ownerReference to it) whose
devices are attached and Bound on the pod's node keeps what they would
cover apart for the grace: no new order is booked onto those units, and no
held set leaves for them. After the grace, or without a claim that holds,
the pod's GPUs are raw use at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE, capacity_problem, free_for_binds
from cozygpu.model.placement import Bind, MarkLost, plan_pass
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import DeviceView, Phase, PodView, Snapshot
from tests.model.factories import H100, NOW, device, gpu_nodes, pod, snapshot, vmi

GRACE = DEFAULT_LAUNCHER_GRACE
STARTED = NOW - timedelta(seconds=1)


def held(*, extra: Iterable[DeviceView] = ()) -> list[DeviceView]:
    """A full node n1 of 2 units: tenant-y's idle hold, tenant-x's hold attached to its VMI vm-x."""
    return [
        device("d1", namespace="tenant-y", phase=Phase.BOUND, node="n1"),
        device("d2", namespace="tenant-x", phase=Phase.BOUND, node="n1", vmi="vm-x", vmi_uid="uid-vm-x"),
        *extra,
    ]


def launcher(*, claims: tuple[str, str] | None = ("vm-x", "uid-vm-x"), node_name: str = "n1",
             created: datetime | None = STARTED, units: int = 1) -> PodView:
    return pod("virt-launcher-vm-x", namespace="tenant-x", node_name=node_name, requests={H100: units},
               claims_vmi=claims, created=created)


def world(pods: Iterable[PodView], *, now: datetime = NOW, units: int = 2,
          devices: Iterable[DeviceView] | None = None) -> Snapshot:
    nodes, inventories = gpu_nodes(("n1", units), ("n2", 1))
    return snapshot(nodes=nodes, inventories=inventories, devices=held() if devices is None else devices,
                    vmis=[vmi("vm-x", namespace="tenant-x", uid="uid-vm-x")], pods=pods, now=now)


def test_an_unlisted_launcher_on_its_own_held_units_is_a_window_not_lost_capacity() -> None:
    snap = world([launcher()])
    entry = snap.capacity["n1"][H100]
    assert (entry.held, entry.raw_in_use, entry.window, entry.free) == (2, 0, 1, 0)
    assert capacity_problem(entry) is None
    assert snap.window_closes == STARTED + GRACE
    plan = plan_pass(snap)
    assert not plan.of(Bind)
    assert not plan.of(MarkLost)


def test_the_window_keeps_new_orders_off_the_units_it_covers() -> None:
    order = device("new", namespace="tenant-z", created=NOW)
    snap = world([launcher()], units=3, devices=held(extra=[order]))
    entry = snap.capacity["n1"][H100]
    assert (entry.free, entry.room, free_for_binds(entry)) == (1, 0, 0)
    assert snap.availability["h100"].node_free["n1"] == 0
    plan = plan_pass(snap)
    assert {b.device: b.node for b in plan.of(Bind)} == {("tenant-z", "new"): "n2"}


def test_once_the_grace_is_over_the_unlisted_pod_is_raw_use_and_a_hold_leaves() -> None:
    snap = world([launcher()], now=STARTED + GRACE)
    entry = snap.capacity["n1"][H100]
    assert (entry.raw_in_use, entry.window, entry.free) == (1, 0, -1)
    assert snap.window_closes is None
    problem = capacity_problem(entry)
    assert problem is not None
    assert problem.reason is Reason.CAPACITY_LOST
    plan = plan_pass(snap)
    assert len(plan.of(Bind)) + len(plan.of(MarkLost)) == 1


def test_a_pod_that_claims_no_vmi_counts_at_once() -> None:
    snap = world([launcher(claims=None)])
    entry = snap.capacity["n1"][H100]
    assert (entry.raw_in_use, entry.window) == (1, 0)
    assert capacity_problem(entry) is not None


def test_a_claim_on_a_vmi_whose_devices_are_held_elsewhere_or_another_uid_counts_at_once() -> None:
    for pods in ([launcher(claims=("vm-x", "another-uid"))],
                 [launcher(claims=("vm-other", "uid-vm-other"))],
                 [launcher(node_name="n2")]):
        snap = world(pods)
        entries = [e for per_node in snap.capacity.values() for e in per_node.values()]
        assert sum(e.window for e in entries) == 0, pods
        assert sum(e.raw_in_use for e in entries) == 1, pods


def test_a_pod_without_a_creation_time_gets_no_window() -> None:
    snap = world([launcher(created=None)])
    assert snap.capacity["n1"][H100].window == 0


def test_what_a_claimant_asks_beyond_its_devices_counts_at_once() -> None:
    snap = world([launcher(units=2)], units=3)
    entry = snap.capacity["n1"][H100]
    assert (entry.raw_in_use, entry.window, entry.free, entry.room) == (1, 1, 0, -1)


def test_a_listed_launcher_is_covered_by_its_devices_and_opens_no_window() -> None:
    nodes, inventories = gpu_nodes(("n1", 2))
    snap = snapshot(nodes=nodes, inventories=inventories, devices=held(), pods=[launcher()],
                    vmis=[vmi("vm-x", namespace="tenant-x", uid="uid-vm-x", active=["uid-virt-launcher-vm-x"])])
    entry = snap.capacity["n1"][H100]
    assert (entry.raw_in_use, entry.window, entry.free) == (0, 0, 0)
    assert snap.window_closes is None


def test_a_lost_set_is_not_rebound_onto_units_a_window_keeps() -> None:
    lost = device("lost", namespace="tenant-z", phase=Phase.LOST)
    snap = world([launcher()], units=3, devices=held(extra=[lost]))
    plan = plan_pass(snap)
    assert {b.device: b.node for b in plan.of(Bind)} == {("tenant-z", "lost"): "n2"}


def test_the_launcher_of_a_vmi_seen_ending_before_its_pod_is_its_holds_whatever_its_age() -> None:
    """The chaos test's "watches cut": a replica's VMI watch came back before its pod watch, so the stopped VM's
    VMI is gone from the view while its launcher (started an hour ago, past the grace) is still there. The
    attachment still names that VMI's UID: the pod is the hold's, kept off new orders but moving no hold. Before,
    it counted as raw use and tenant-y's hold was moved off the full node."""
    old = NOW - timedelta(hours=1)
    nodes, inventories = gpu_nodes(("n1", 2), ("n2", 1))
    snap = snapshot(nodes=nodes, inventories=inventories, devices=held(), vmis=[], pods=[launcher(created=old)])
    entry = snap.capacity["n1"][H100]
    assert (entry.held, entry.raw_in_use, entry.window, entry.free) == (2, 0, 1, 0)
    assert snap.window_closes is None, "no deadline: the claim ends with the pod, or with the attachment"
    plan = plan_pass(snap)
    assert not plan.of(Bind)
    assert not plan.of(MarkLost)
    # An attachment that never recorded the UID proves nothing once the grace is over; nor does another UID.
    for claims in (("vm-x", "uid-other"),):
        other = snapshot(nodes=nodes, inventories=inventories, devices=held(), vmis=[],
                         pods=[launcher(created=old, claims=claims)])
        assert other.capacity["n1"][H100].raw_in_use == 1
    unrecorded = [held()[0], device("d2", namespace="tenant-x", phase=Phase.BOUND, node="n1", vmi="vm-x")]
    bare = snapshot(nodes=nodes, inventories=inventories, devices=unrecorded, vmis=[], pods=[launcher(created=old)])
    assert bare.capacity["n1"][H100].raw_in_use == 1


def test_a_live_vmi_that_does_not_list_an_old_pod_claiming_it_gives_it_no_cover() -> None:
    """R-MOD-5 stands: past the grace, a claim on a VMI that exists (and does not list the pod) proves nothing."""
    snap = world([launcher(created=NOW - timedelta(hours=1))])
    assert snap.capacity["n1"][H100].raw_in_use == 1
