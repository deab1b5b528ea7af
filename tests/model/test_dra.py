"""DRA units (and the ResourceSlice decoding they read): the devices of the current, complete pools that
the DeviceClass's and the offer's selectors match."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import attrs
import hypothesis
import pytest
from hypothesis import strategies as hst

from cozygpu.api import claims as claims_api
from cozygpu.devcluster import dra_driver
from cozygpu.model.catalog import catalog, refusal_for
from cozygpu.model.cel import DeviceAttrs
from cozygpu.model.derive import ModelTables
from cozygpu.model.dra import (
    ClaimView,
    DeviceRef,
    DraUnits,
    SliceDevice,
    SliceView,
    choose_devices,
    current_slices,
    dra_served,
    offer_units,
    taken_devices,
    with_rule_taints,
)
from cozygpu.model.dra_claims import ClaimAction, claim_plan
from cozygpu.model.dra_tracker import DraTracker
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import DeviceView, DraSource, GPUClassView, Phase, Snapshot
from cozygpu.views.decode import gpu_class_view
from cozygpu.views.decode_dra import device_taint_rule_view, resource_claim_view, resource_slice_view
from tests.model.factories import NOW, device, gpu_class, inventory, node

VFIO_CLASS = tuple(s["cel"]["expression"] for s in dra_driver.device_class()["spec"]["selectors"])


def node_slice(node: str, gpus: int, *, generation: int = 1) -> SliceView:
    return resource_slice_view(dra_driver.resource_slice(node, f"uid-{node}", gpus, generation=generation))


def refs(node: str, *indexes: int) -> tuple[DeviceRef, ...]:
    return tuple(DeviceRef(dra_driver.DRIVER, node, dra_driver.device_name(i)) for i in indexes)


def test_every_vfio_gpu_of_a_node_is_a_unit_of_nvidias_vfio_class() -> None:
    units = offer_units([node_slice("n1", 2), node_slice("n2", 4)], VFIO_CLASS, ())
    assert units.by_node == {"n1": refs("n1", 0, 1), "n2": refs("n2", 0, 1, 2, 3)}
    assert units.count("n2") == 4
    assert units.count("n3") == 0
    assert units.problems == ()


def test_the_offers_own_selectors_narrow_the_units() -> None:
    view = node_slice("n1", 8)
    numa_zero = [d.name for d in view.devices
                 if d.attrs and d.attrs.attributes["resource.kubernetes.io"]["numaNode"] == 0]
    units = offer_units([view], VFIO_CLASS, ("device.attributes['resource.kubernetes.io'].numaNode == 0",))
    assert [ref.device for ref in units.by_node["n1"]] == sorted(numa_zero)
    assert 0 < units.count("n1") < 8


def test_a_device_of_another_type_is_no_unit() -> None:
    body = dra_driver.resource_slice("n1", "uid-n1", 2)
    body["spec"]["devices"][1]["attributes"]["type"] = {"string": "gpu"}  # a container GPU of the same driver
    view = resource_slice_view(body)
    units = offer_units([view], VFIO_CLASS, ())
    assert units.by_node == {"n1": refs("n1", 0)}


@pytest.mark.parametrize(("effect", "unit"), [("NoSchedule", False), ("NoExecute", False), ("None", True)])
def test_a_device_its_driver_tainted_is_no_unit_and_says_so(effect: str, unit: bool) -> None:
    body = dra_driver.resource_slice("n1", "uid-n1", 2)
    body["spec"]["devices"][0]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": effect}]
    units = offer_units([resource_slice_view(body)], VFIO_CLASS, ())
    assert units.by_node == {"n1": refs("n1", 0, 1) if unit else refs("n1", 1)}
    assert units.problems == (() if unit else (
        f"device 'gpu-vfio-0' of pool 'n1' is tainted gpu.nvidia.com/xid=79:{effect}",))


def taint_rule(name: str, effect: str = "NoSchedule", **selector: str) -> dict[str, Any]:
    """A DeviceTaintRule (``resource.k8s.io/v1``, 1.37) selecting by driver, pool and device."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": {"deviceSelector": selector, "taint": {"key": "example.com/maintenance", "value": name,
                                                             "effect": effect}}}


def test_a_device_a_taint_rule_selects_is_no_unit_and_the_rule_is_named() -> None:
    rule = device_taint_rule_view(taint_rule("fix-n1", driver=dra_driver.DRIVER, pool="n1",
                                             device=dra_driver.device_name(0)))
    assert rule is not None
    slices = with_rule_taints([node_slice("n1", 2), node_slice("n2", 2)], [rule])
    units = offer_units(slices, VFIO_CLASS, ())
    assert units.by_node == {"n1": refs("n1", 1), "n2": refs("n2", 0, 1)}
    assert units.problems == ("device 'gpu-vfio-0' of pool 'n1' is tainted "
                              "example.com/maintenance=fix-n1:NoSchedule (DeviceTaintRule fix-n1)",)


def test_a_taint_rules_selector_fields_are_anded_and_the_empty_selector_takes_every_device() -> None:
    slices = [node_slice("n1", 2), node_slice("n2", 2)]

    def units_after(body: dict[str, Any]) -> dict[str, tuple[DeviceRef, ...]]:
        rule = device_taint_rule_view(body)
        return dict(offer_units(with_rule_taints(slices, [rule] if rule else []), VFIO_CLASS, ()).by_node)

    assert units_after(taint_rule("pool", pool="n2")) == {"n1": refs("n1", 0, 1)}
    assert units_after(taint_rule("both", pool="n2", device=dra_driver.device_name(1))) == {
        "n1": refs("n1", 0, 1), "n2": refs("n2", 0)}
    assert units_after(taint_rule("other-driver", driver="gpu.example.com", pool="n2")) == {
        "n1": refs("n1", 0, 1), "n2": refs("n2", 0, 1)}
    assert units_after(taint_rule("all")) == {}


def test_a_taint_rule_of_effect_none_or_without_a_selector_keeps_nothing_off() -> None:
    assert device_taint_rule_view(taint_rule("inform", effect="None", pool="n1")) is None
    no_selector = taint_rule("none")
    del no_selector["spec"]["deviceSelector"]
    assert device_taint_rule_view(no_selector) is None
    untouched = [node_slice("n1", 2)]
    assert with_rule_taints(untouched, []) is untouched


def test_only_the_newest_complete_generation_of_a_pool_counts() -> None:
    old, new = node_slice("n1", 2, generation=1), node_slice("n1", 3, generation=2)
    assert offer_units([old, new], VFIO_CLASS, ()).by_node == {"n1": refs("n1", 0, 1, 2)}
    half = attrs.evolve(node_slice("n1", 3, generation=3), slice_count=2)
    units = offer_units([old, new, half], VFIO_CLASS, ())
    assert units.by_node == {}, "the newest generation announces two slices and has one: the pool waits"
    assert units.problems == ("pool 'n1' of driver 'gpu.nvidia.com' is incomplete: 1 of 2 slices of generation 3 "
                              "published",)


def test_a_slice_for_no_one_node_serves_no_node() -> None:
    shared = attrs.evolve(node_slice("n1", 2), node="", pool="fabric")
    current, problems = current_slices([shared])
    assert (current, problems) == ([], [])


def test_a_selector_outside_the_subset_serves_nothing_and_says_why() -> None:
    units = offer_units([node_slice("n1", 2)], VFIO_CLASS, ("device.attributes['gpu.nvidia.com'].exists(x, x)",))
    assert units.by_node == {}
    assert len(units.problems) == 1
    assert units.problems[0].startswith("selector 0 of the class is refused: unsupported at")


def test_a_selector_failing_on_some_devices_leaves_them_out_once_named() -> None:
    units = offer_units([node_slice("n1", 2), node_slice("n2", 2)], VFIO_CLASS,
                        ("device.attributes['gpu.nvidia.com'].nvlinkPartition == 'a'",))
    assert units.by_node == {}
    assert len(units.problems) == 1, "one reason for the four devices"
    assert units.problems[0].endswith("(4 devices)")


def test_without_its_device_class_an_offer_serves_nothing() -> None:
    units = offer_units([node_slice("n1", 2)], None, ())
    assert units.by_node == {}
    assert units.problems == ("its DeviceClass does not exist",)


def test_an_unreadable_device_is_left_out_and_named() -> None:
    view = node_slice("n1", 2)
    broken = SliceDevice(name="gpu-vfio-1", attrs=None, problem="no value")
    units = offer_units([attrs.evolve(view, devices=(view.devices[0], broken))], VFIO_CLASS, ())
    assert units.by_node == {"n1": refs("n1", 0)}
    assert units.problems == ("device 'gpu-vfio-1' of pool 'n1' is unreadable: no value",)


def test_a_slice_device_whose_attribute_has_no_value_is_kept_unreadable_with_why() -> None:
    body = dra_driver.resource_slice("n1", "uid-n1", 2)
    body["spec"]["devices"][1]["attributes"]["productName"] = {}
    view = resource_slice_view(body)
    assert view.devices[0].attrs is not None
    assert view.devices[1].attrs is None
    assert "productName" in view.devices[1].problem
    assert offer_units([view], VFIO_CLASS, ()).by_node == {"n1": refs("n1", 0)}


def claim(name: str, *devices: DeviceRef, holder: str = "") -> ClaimView:
    return ClaimView(namespace="tenant-a", name=name, allocated=devices, holder=holder)


def test_a_device_any_claim_allocated_is_taken_ours_or_not() -> None:
    ours, foreign = claim("gpu-a", *refs("n1", 0), holder="gpu-a"), claim("pod-claim", *refs("n1", 2))
    taken = taken_devices([foreign, ours, claim("pending")])
    assert taken == {refs("n1", 0)[0]: ours, refs("n1", 2)[0]: foreign}


def test_a_hold_takes_free_devices_and_only_when_there_are_enough() -> None:
    units = refs("n1", 0, 1, 2, 3)
    assert choose_devices(units, set(refs("n1", 0, 2)), 2) == refs("n1", 1, 3)
    assert choose_devices(units, set(refs("n1", 0, 2)), 3) is None
    assert choose_devices(units, set(), 10**9) is None, "a count beyond the node is refused before any work"
    assert choose_devices(units, set(), 0) is None


def test_a_set_that_must_share_a_pcie_root_takes_the_smallest_root_that_fits() -> None:
    view = node_slice("n1", 8)  # two GPUs a PCIe root
    attrs_of = {DeviceRef(view.driver, view.pool, d.name): d.attrs for d in view.devices if d.attrs is not None}
    root = {ref: a.attributes["resource.kubernetes.io"]["pcieRoot"] for ref, a in attrs_of.items()}
    units = tuple(sorted(attrs_of))
    taken = {units[0]}  # one GPU of the first root is held: that root has one left
    one = choose_devices(units, taken, 1, attrs_of=attrs_of, match_attribute="resource.kubernetes.io/pcieRoot")
    assert one == (units[1],), "best fit: the root with one free GPU, the whole roots kept for pairs"
    pair = choose_devices(units, taken, 2, attrs_of=attrs_of, match_attribute="resource.kubernetes.io/pcieRoot")
    assert pair is not None
    assert len({root[ref] for ref in pair}) == 1
    assert choose_devices(units, taken, 3, attrs_of=attrs_of, match_attribute="resource.kubernetes.io/pcieRoot") \
        is None, "no root has three GPUs, though the node has seven free"
    assert choose_devices(units, set(), 2, attrs_of=attrs_of, match_attribute="example.com/nvlinkDomain") is None, \
        "no device carries the attribute"


def test_the_hold_claim_as_built_reads_back_as_its_devices_node_and_holder() -> None:
    devices = refs("n1", 1, 3)
    made = claims_api.hold_claim("gpu-a", "uid-a", device_class=dra_driver.DEVICE_CLASS, count=2,
                                 selectors=("device.attributes['resource.kubernetes.io'].numaNode == 0",),
                                 match_attribute="resource.kubernetes.io/pcieRoot")
    made["metadata"]["namespace"] = "tenant-a"
    made["status"] = claims_api.hold_status("n1", devices, device_name="gpu-a", device_uid="uid-a", now=NOW)
    view = resource_claim_view(made)
    assert view == ClaimView(namespace="tenant-a", name="gpu-a", allocated=devices, node="n1", holder="gpu-a")
    requests = made["spec"]["devices"]["requests"]
    assert [(r["name"], r["exactly"]["count"]) for r in requests] == [("gpu-0", 1), ("gpu-1", 1)], \
        "one device per request: KubeVirt's launcher takes exactly one device per gpus entry"
    assert [r["request"] for r in made["status"]["allocation"]["devices"]["results"]] == ["gpu-0", "gpu-1"]
    assert made["spec"]["devices"]["constraints"] == [{"requests": ["gpu-0", "gpu-1"],
                                                       "matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    assert made["status"]["reservedFor"] == [{"apiGroup": "gpu.cozystack.io", "resource": "gpudevices",
                                              "name": "gpu-a", "uid": "uid-a"}]


def test_a_claim_of_someone_else_has_no_holder() -> None:
    made = {"metadata": {"name": "mine", "namespace": "tenant-a", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}]},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": dra_driver.DRIVER, "pool": "n1", "device": "gpu-vfio-0"}]}}}}
    assert resource_claim_view(made) == ClaimView(namespace="tenant-a", name="mine", allocated=refs("n1", 0))


DRA_NAME = "deviceclass.resource.kubernetes.io/vfio.gpu.nvidia.com"


def dra_world(tables: ModelTables, dra: dict[str, dict[str, int]], *, reported: datetime | None = None) -> Snapshot:
    """A DRA class over nodes n1 (no agent report, or a stale one) and n2, one set of 1 held on n1."""
    reports = [inventory("n1", {}, last_report=reported)] if reported is not None else []
    return tables.rebuild(now=NOW, classes=[gpu_class("dra-h100", resource=DRA_NAME)],
                            devices=[device("held", phase=Phase.BOUND, node="n1", cls="dra-h100")],
                            nodes=[node("n1"), node("n2")], inventories=reports, pods=[], vmis=[], namespaces=[],
                            dra=dra)


def test_a_nodes_dra_units_serve_its_offer_with_no_agent_report_and_never_go_stale() -> None:
    snapshot = dra_world(ModelTables(), {"n1": {DRA_NAME: 2}, "n2": {DRA_NAME: 4}},
                         reported=NOW - timedelta(days=1))  # n1's agent report is a day old
    entry = snapshot.capacity["n1"][DRA_NAME]
    assert (entry.served, entry.held, entry.fresh, entry.room) == (2, 1, True, 1)
    assert snapshot.availability["dra-h100"].node_free == {"n1": 1, "n2": 4}


def test_dra_units_moved_by_an_update_are_what_a_rebuild_makes() -> None:
    tables = ModelTables()
    dra_world(tables, {"n1": {DRA_NAME: 2}, "n2": {DRA_NAME: 4}})
    updated = tables.update(now=NOW, devices={}, dra={"n2": {DRA_NAME: 1}})
    rebuilt = dra_world(ModelTables(), {"n1": {DRA_NAME: 2}, "n2": {DRA_NAME: 1}})
    assert updated.capacity == rebuilt.capacity
    assert updated.availability == rebuilt.availability
    gone = tables.update(now=NOW, devices={}, dra={"n2": {}})
    assert "n2" not in gone.capacity, "no units left and nothing held there: the node serves nothing"
    assert gone.availability["dra-h100"].node_free == {"n1": 1}


def dra_class(name: str, *, selectors: tuple[str, ...] = (), resource: str = DRA_NAME) -> GPUClassView:
    return attrs.evolve(gpu_class(name, resource=resource),
                        dra=DraSource(device_class=dra_driver.DEVICE_CLASS, selectors=selectors))


def test_what_dra_classes_serve_leaves_out_devices_of_someone_elses_claims_but_keeps_holds() -> None:
    slices = [node_slice("n1", 4), node_slice("n2", 2)]
    held = claim("gpu-a", *refs("n1", 0), holder="gpu-a")
    pods_own = claim("pod-claim", *refs("n1", 1, 2))
    served = dra_served([dra_class("dra-h100"), gpu_class("plugin")], slices, {dra_driver.DEVICE_CLASS: VFIO_CLASS},
                        [held, pods_own])
    assert served.by_node == {"n1": {DRA_NAME: 2}, "n2": {DRA_NAME: 2}}, "n1: four, two of them a pod's claim's"
    assert served.problems == {}


def test_classes_selling_one_name_from_different_offers_take_the_first_and_say_so() -> None:
    narrow = dra_class("b-narrow", selectors=("device.attributes['resource.kubernetes.io'].numaNode == 1",))
    served = dra_served([narrow, dra_class("a-all")], [node_slice("n1", 8)], {dra_driver.DEVICE_CLASS: VFIO_CLASS},
                        [])
    assert served.by_node == {"n1": {DRA_NAME: 8}}, "a-all's offer, first by name"
    assert served.problems == {"b-narrow": (f"class 'a-all' sells {DRA_NAME} from another DRA offer; its units "
                                            "are used",)}


def test_a_dra_class_whose_device_class_is_gone_serves_nothing_and_says_why() -> None:
    served = dra_served([dra_class("dra-h100")], [node_slice("n1", 2)], {}, [])
    assert served.by_node == {}
    assert served.problems == {"dra-h100": ("its DeviceClass does not exist",)}


def test_the_class_view_reads_its_dra_source() -> None:
    vfio = "device.attributes['gpu.nvidia.com'].type == 'vfio'"
    source: dict[str, Any] = {"dra": {"deviceClassName": dra_driver.DEVICE_CLASS, "selectors": [{"cel": {
        "expression": vfio}}], "matchAttribute": "resource.kubernetes.io/pcieRoot"}}
    spec: dict[str, Any] = {"mode": "Passthrough", "resourceName": DRA_NAME, "source": source}
    obj = {"metadata": {"name": "dra-h100"}, "spec": spec}
    assert gpu_class_view(obj).dra == DraSource(device_class=dra_driver.DEVICE_CLASS, selectors=(vfio,),
                                                match_attribute="resource.kubernetes.io/pcieRoot")
    spec["source"] = {"devicePlugin": {}}
    assert gpu_class_view(obj).dra is None


def plan_world(*gpus: int) -> tuple[dict[str, DraUnits], dict[DeviceRef, DeviceAttrs]]:
    """Nodes n1, n2, … with that many vfio GPUs each: the DRA offer's units and the devices' attributes."""
    slices = [node_slice(f"n{i + 1}", count) for i, count in enumerate(gpus)]
    attrs_of = {DeviceRef(view.driver, view.pool, d.name): d.attrs for view in slices for d in view.devices
                if d.attrs is not None}
    return {DRA_NAME: offer_units(slices, VFIO_CLASS, ())}, attrs_of


DRA_CLASSES = {"dra-h100": dra_class("dra-h100")}


def bound(name: str, node: str, count: int = 1) -> DeviceView:
    return device(name, phase=Phase.BOUND, node=node, count=count, cls="dra-h100")


def test_a_bound_device_without_a_claim_gets_one_holding_free_devices_of_its_node() -> None:
    units, attrs_of = plan_world(4)
    others = {("tenant-a", "pod-claim"): claim("pod-claim", *refs("n1", 0))}
    steps = claim_plan([bound("a", "n1", 2), bound("b", "n1", 1)], DRA_CLASSES, others, units, attrs_of)
    assert [(s.device[1], s.action, s.devices) for s in steps] == [
        ("a", ClaimAction.CREATE, refs("n1", 1, 2)),
        ("b", ClaimAction.CREATE, refs("n1", 3)),
    ], "someone else's device is left alone, and two holds never share one"


def test_a_claim_holding_its_devices_on_its_node_is_left_alone_and_a_moved_set_is_allocated_again() -> None:
    units, attrs_of = plan_world(2, 2)
    kept = claim("a", *refs("n1", 0), holder="a")
    moved = ClaimView(namespace="tenant-a", name="b", allocated=refs("n1", 1), node="n1", holder="b")
    steps = claim_plan([bound("a", "n1"), bound("b", "n2")], DRA_CLASSES,
                       {("tenant-a", "a"): attrs.evolve(kept, node="n1"), ("tenant-a", "b"): moved}, units, attrs_of)
    assert [(s.device[1], s.action, s.node, s.devices) for s in steps] == [
        ("b", ClaimAction.REALLOCATE, "n2", refs("n2", 0))]


def test_a_running_vms_claim_is_not_moved() -> None:
    units, attrs_of = plan_world(2, 2)
    moved = ClaimView(namespace="tenant-a", name="b", allocated=refs("n1", 1), node="n1", holder="b")
    assert claim_plan([bound("b", "n2")], DRA_CLASSES, {("tenant-a", "b"): moved}, units, attrs_of,
                      in_use={("tenant-a", "b")}) == [], "R-BIND-7: the move waits for the VM's stop"


def test_a_hold_whose_devices_someone_else_took_says_so_with_the_numbers() -> None:
    units, attrs_of = plan_world(2)
    foreign = claim("pod-claim", *refs("n1", 0))
    steps = claim_plan([bound("a", "n1", 2)], DRA_CLASSES, {("tenant-a", "pod-claim"): foreign}, units, attrs_of)
    assert [s.action for s in steps] == [ClaimAction.SHORT]
    refusal = steps[0].refusal
    assert refusal is not None
    assert (refusal.reason, refusal.limit, refusal.requested) == (Reason.DEVICES_SHORT, 1, 2)
    assert refusal.message == "node n1: GPUDevice tenant-a/a holds 2 device(s) there and 1 are free for its claim"


def test_an_unallocated_claim_is_allocated_and_a_device_plugin_class_is_not_the_plans() -> None:
    units, attrs_of = plan_world(2)
    empty = ClaimView(namespace="tenant-a", name="a", holder="a")
    plugin = device("p", phase=Phase.BOUND, node="n1", cls="h100")
    steps = claim_plan([bound("a", "n1"), plugin], {**DRA_CLASSES, "h100": gpu_class()}, {("tenant-a", "a"): empty},
                       units, attrs_of)
    assert [(s.device[1], s.action, s.devices) for s in steps] == [("a", ClaimAction.ALLOCATE, refs("n1", 0))]


_CLAIM_NAMES = ("a", "b", "c", "d")
_DEVICES = refs("n1", 0, 1, 2, 3, 4) + refs("n2", 0, 1)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(hst.lists(hst.tuples(hst.sampled_from(_CLAIM_NAMES), hst.booleans(), hst.booleans(),
                                       hst.sets(hst.sampled_from(_DEVICES), max_size=2)), max_size=12),
                  hst.sampled_from(("", "resource.kubernetes.io/pcieRoot")))
def test_the_tracker_kept_from_claim_changes_equals_the_served_of_its_claims(
        changes: list[tuple[str, bool, bool, set[DeviceRef]]], match: str) -> None:
    """Claims come, change, overlap (two claiming one device: the first by key decides) and go; after each
    change the tracker equals ``dra_served`` over the claims it holds, and it names every node that moved."""
    classes = [attrs.evolve(dra_class("dra-h100"), dra=DraSource(device_class=dra_driver.DEVICE_CLASS,
                                                                 match_attribute=match))]
    slices = [node_slice("n1", 5), node_slice("n2", 2)]
    device_classes = {dra_driver.DEVICE_CLASS: VFIO_CLASS}
    tracker = DraTracker(classes, slices, device_classes, [])
    held: dict[tuple[str, str], ClaimView] = {}
    for name, gone, ours, devices in changes:
        key = ("tenant-a", name)
        before = tracker.served()
        view = None if gone else claim(name, *sorted(devices), holder=name if ours else "")
        changed = tracker.claims_changed({key: view})
        moved, raw = changed.served, changed.raw
        if view is None:
            held.pop(key, None)
        else:
            held[key] = view
        after = tracker.served()
        reference = dra_served(classes, slices, device_classes, held.values())
        assert after == reference.by_node
        assert tracker.raw_by_namespace == reference.raw_by_namespace
        assert raw == {"tenant-a": dict(reference.raw_by_namespace.get("tenant-a", {}))}
        assert {node for node in set(before) | set(after) if before.get(node) != after.get(node)} <= set(moved)
        assert all(after.get(node, {}) == served for node, served in moved.items())


def test_with_match_attribute_a_node_serves_its_holds_and_its_largest_free_group_sharing_one_value() -> None:
    """Topology (SPEC §1.5): eight GPUs on two PCIe roots; someone else's claim takes one of the first root.
    A pcieRoot offer serves the hold's GPU plus the largest free group; an order larger than that group is
    refused before it is placed, and the refusal names the attribute."""
    pcie = "resource.kubernetes.io/pcieRoot"
    root = dra_driver.GPUS_PER_ROOT
    offer = attrs.evolve(dra_class("dra-h100"), dra=DraSource(device_class=dra_driver.DEVICE_CLASS,
                                                               match_attribute=pcie))
    slices = [node_slice("n1", 2 * root), node_slice("n2", 1)]
    device_classes = {dra_driver.DEVICE_CLASS: VFIO_CLASS}
    foreign, hold = claim("pod-claim", *refs("n1", 0)), claim("gpu-a", *refs("n1", root), holder="gpu-a")
    served = dra_served([offer], slices, device_classes, [foreign, hold])
    assert served.by_node == {"n1": {DRA_NAME: 1 + (root - 1)}, "n2": {DRA_NAME: 1}}, \
        "the hold, and the second root less the hold"
    plain = dra_served([dra_class("dra-h100")], slices, device_classes, [foreign, hold])
    assert plain.by_node["n1"] == {DRA_NAME: 2 * root - 1}, "without the constraint: every GPU but the foreign one"
    held = device("gpu-a", cls="dra-h100", phase=Phase.BOUND, node="n1")
    snapshot = ModelTables().rebuild(now=NOW, classes=[offer], devices=[held], nodes=[node("n1"), node("n2")],
                                  inventories=[],
                                  pods=[], vmis=[], namespaces=[], dra=served.by_node)
    [entry] = catalog(snapshot, "tenant-a")
    assert entry.free_on_best_node == root - 1
    refusal = refusal_for(entry, root, gpu_class=offer)
    assert refusal is not None
    assert refusal.reason is Reason.NO_NODE_WITH_ROOM
    assert refusal.message == (f"class dra-h100: at most 1 unit sharing one {pcie} free on one node (node n1), "
                               f"order of {root} exceeds it by 1")
