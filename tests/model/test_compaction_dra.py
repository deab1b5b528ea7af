"""Compaction of a DRA class with ``matchAttribute`` (R-BIND-11, SPEC §1.5): the room is made in one group of a
node (one PCIe root), by moving the stopped holds of that group; the groups the read model keeps are the ones
a tracker built from scratch on the same claims has."""

from __future__ import annotations

import attrs
import hypothesis
from hypothesis import strategies as hst

from cozygpu.devcluster import dra_driver
from cozygpu.model.derive import ModelTables
from cozygpu.model.dra import ClaimView, DeviceRef
from cozygpu.model.dra_claims import ClaimAction, claim_plan
from cozygpu.model.dra_tracker import DraTracker
from cozygpu.model.placement import Bind, order_check, plan_pass
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import DeviceView, DraSource, GPUClassView, Phase, Snapshot
from cozygpu.views.decode_dra import resource_slice_view
from tests.model.factories import NOW, device, gpu_class, node

PCIE = "resource.kubernetes.io/pcieRoot"
DRA_NAME = "deviceclass.resource.kubernetes.io/vfio.gpu.nvidia.com"
VFIO_CLASS = tuple(s["cel"]["expression"] for s in dra_driver.device_class()["spec"]["selectors"])
ROOT = dra_driver.GPUS_PER_ROOT
NODES = ("n1", "n2")
#: The simulated driver's pcieRoot values of a node's first two roots, as a group's value reads them (typed).
ROOT_0, ROOT_1 = "str:pci0000:00", "str:pci0000:10"


def offer(*, match_attribute: str = PCIE) -> GPUClassView:
    return attrs.evolve(gpu_class("dra-h100", resource=DRA_NAME),
                        dra=DraSource(device_class=dra_driver.DEVICE_CLASS, match_attribute=match_attribute))


def ref(node: str, index: int) -> DeviceRef:
    return DeviceRef(dra_driver.DRIVER, node, dra_driver.device_name(index))


def hold_claim(name: str, node: str, *indexes: int) -> ClaimView:
    return ClaimView(namespace="tenant-b", name=name, allocated=tuple(ref(node, i) for i in indexes), node=node,
                     holder=name)


def world(claims: list[ClaimView], holds: list[DeviceView], *, gpus: int = 2 * ROOT,
          gpu_class: GPUClassView | None = None) -> tuple[Snapshot, DraTracker]:
    """Nodes n1 and n2 of ``gpus`` vfio GPUs each (two PCIe roots of ``ROOT`` at the default), these claims."""
    cls = gpu_class or offer()
    slices = [resource_slice_view(dra_driver.resource_slice(n, f"uid-{n}", gpus)) for n in NODES]
    tracker = DraTracker([cls], slices, {dra_driver.DEVICE_CLASS: VFIO_CLASS}, claims)
    snapshot = ModelTables().rebuild(now=NOW, classes=[cls], devices=holds, nodes=[node(n) for n in NODES],
                                  inventories=[], pods=[], vmis=[], namespaces=[], dra=tracker.served(),
                                  dra_groups=tracker.groups())
    return snapshot, tracker


def held(name: str, node_name: str) -> DeviceView:
    return device(name, cls="dra-h100", phase=Phase.BOUND, node=node_name, namespace="tenant-b")


def scattered() -> tuple[Snapshot, DraTracker]:
    """n1: root 0 holds a and b (full), root 1 one free GPU and c's; n2: each root one free GPU and one hold (d, e).
    No root has two free: an order of two that must share a root fits nowhere as things are."""
    claims = [hold_claim("a", "n1", 0), hold_claim("b", "n1", 1), hold_claim("c", "n1", 3),
              hold_claim("d", "n2", 1), hold_claim("e", "n2", 3)]
    holds = [held("a", "n1"), held("b", "n1"), held("c", "n1"), held("d", "n2"), held("e", "n2")]
    return world(claims, [*holds, device("pair", cls="dra-h100", count=2)])


def test_the_order_goes_to_the_root_one_move_frees_and_the_hold_moved_is_that_roots() -> None:
    snapshot, _ = scattered()
    assert ROOT == 2, "the fleet below is drawn for two GPUs per root"
    assert {node: {g.value: (g.free, sorted(k[1] for k in g.holds)) for g in groups[DRA_NAME]}
            for node, groups in snapshot.dra_groups.items()} == {
        "n1": {ROOT_0: (0, ["a", "b"]), ROOT_1: (1, ["c"])},
        "n2": {ROOT_0: (1, ["d"]), ROOT_1: (1, ["e"])}}
    made = list(plan_pass(snapshot).of(Bind))
    # Moving a (first by name, n1's fewest-free node count) would leave root 0 with one free: the plan moves the
    # hold of a root with one free already. n1's root 1 and n2's two roots each qualify; n1 is fuller (R-BIND-5).
    assert [(b.device[1], b.previous, b.node) for b in made] == [("c", "n1", "n2"), ("pair", None, "n1")]
    assert made[0].cause is not None
    assert made[0].cause.reason is Reason.COMPACTION


def test_the_freed_root_is_what_the_orders_claim_is_allocated_from_once_the_moved_claim_let_go() -> None:
    """After the plan: c Bound on n2 with its claim deallocated, the pair Bound on n1: the claims work takes
    both GPUs of root 1 for the pair and a free GPU of n2 for c."""
    claims = [hold_claim("a", "n1", 0), hold_claim("b", "n1", 1), hold_claim("d", "n2", 1), hold_claim("e", "n2", 3),
              ClaimView(namespace="tenant-b", name="c", allocated=(), holder="c")]
    holds = [held("a", "n1"), held("b", "n1"), held("c", "n2"), held("d", "n2"), held("e", "n2"),
             attrs.evolve(held("pair", "n1"), namespace="tenant-a", count=2)]
    snapshot, tracker = world(claims, holds)
    own = {(c.namespace, c.name): c for c in claims}
    steps = {step.device[1]: step for step in claim_plan(holds, snapshot.classes, own, tracker.units,
                                                         tracker.attrs_of)}
    assert steps["pair"].action is ClaimAction.CREATE
    assert steps["pair"].devices == (ref("n1", 2), ref("n1", 3))
    assert steps["c"].action is ClaimAction.ALLOCATE
    assert steps["c"].node == "n2"


def test_holds_of_a_full_root_that_two_moves_would_free_lose_to_one_move_elsewhere() -> None:
    # Without the groups, a node-wide plan would count n1's three movable holds against its one free GPU and
    # move a (first by name), leaving no root with two free.
    snapshot, _ = scattered()
    check = order_check(snapshot, "tenant-a", "dra-h100", 2, label="pair-2")
    assert check.refusal is None
    assert check.compaction is not None
    assert [(m.device[1], m.source) for m in check.compaction.moves] == [("c", "n1")]


def test_with_every_hold_under_a_vm_the_order_is_refused_with_the_roots_numbers() -> None:
    # One GPU of each root held by a VM's set: every root has one free, and nothing may move.
    placed = [(f"{n}-{i}", n, i) for n in NODES for i in (0, 2)]
    claims = [hold_claim(name, n, i) for name, n, i in placed]
    holds = [device(name, cls="dra-h100", phase=Phase.BOUND, node=n, namespace="tenant-b", vmi=f"vm-{name}")
             for name, n, _ in placed]
    snapshot, _ = world(claims, holds)
    check = order_check(snapshot, "tenant-a", "dra-h100", 2, label="pair")
    assert check.compaction is None
    assert check.refusal is not None
    assert check.refusal.reason is Reason.NO_NODE_WITH_ROOM
    assert check.refusal.message == (f"class dra-h100: at most 1 unit sharing one {PCIE} free on one node (node n1), "
                                     "order of 2 exceeds it by 1")


def test_a_hold_whose_claim_spans_two_roots_is_in_neither() -> None:
    _, tracker = world([hold_claim("wide", "n1", 1, 2)], [held("wide", "n1")], gpu_class=offer())
    groups = tracker.groups_on("n1")[DRA_NAME]
    assert [(g.value, g.free, g.holds) for g in groups] == [(ROOT_0, 1, frozenset()), (ROOT_1, 1, frozenset())]


@hypothesis.given(hst.lists(hst.tuples(hst.sampled_from(NODES), hst.sets(hst.integers(0, 2 * ROOT - 1),
                                                                         min_size=1, max_size=2), hst.booleans()),
                            max_size=8))
def test_the_groups_claim_changes_leave_are_the_ones_a_tracker_built_on_the_same_claims_has(
        changes: list[tuple[str, set[int], bool]]) -> None:
    """Claims (holds and someone else's) allocated and let go one by one, in any order: each change's groups
    for the nodes it touched, and the tracker's groups, equal a tracker built from scratch on the claims left."""
    _, tracker = world([], [])
    tables = ModelTables()
    tables.rebuild(now=NOW, classes=[offer()], devices=[], nodes=[node(n) for n in NODES], inventories=[], pods=[],
                     vmis=[], namespaces=[], dra=tracker.served(), dra_groups=tracker.groups())
    claims: dict[tuple[str, str], ClaimView] = {}
    for i, (node_name, indexes, ours) in enumerate(changes):
        key = ("tenant-b", f"claim-{i % 3}")  # a key comes back: a claim replaced, or let go below
        view = None if i % 4 == 3 else ClaimView(namespace=key[0], name=key[1], node=node_name, holder=key[1] if ours
                                                 else "", allocated=tuple(ref(node_name, j) for j in sorted(indexes)))
        changed = tracker.claims_changed({key: view})
        if view is None:
            claims.pop(key, None)
        else:
            claims[key] = view
        live = tables.update(now=NOW, devices={}, dra=changed.served, dra_raw=changed.raw, dra_groups=changed.groups)
        rebuilt, fresh = world(list(claims.values()), [])
        assert tracker.groups() == fresh.groups()
        assert all(fresh.groups_on(n) == groups for n, groups in changed.groups.items())
        assert dict(live.dra_groups) == dict(rebuilt.dra_groups)
