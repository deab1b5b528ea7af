"""GPUClass status and GPUNode conditions: the numbers, the reasons, and no write when nothing changed."""

from __future__ import annotations

from datetime import timedelta

from cozygpu.binder import reports
from cozygpu.binder.reports import class_status, node_conditions, report_writes
from cozygpu.model.derive import ModelTables
from cozygpu.model.snapshot import Phase, Taint
from tests.model.factories import H100, NOW, device, gpu_class, gpu_nodes, inventory, node, pod, snapshot


def conditions_by_type(conditions: list[dict[str, str]]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in conditions}


def test_class_status_counts_units_of_eligible_nodes_held_devices_and_free_units() -> None:
    snap = snapshot(
        nodes=[node("n1"), node("n2"), node("tainted", taints=(Taint(key="gpu", value="x", effect="NoSchedule"),))],
        inventories=[inventory("n1", {H100: 8}), inventory("n2", {H100: 4}), inventory("tainted", {H100: 8})],
        devices=[device("a", count=3, phase=Phase.BOUND, node="n1"), device("b", count=1, phase=Phase.BOUND, node="n2"),
                 device("lost", count=2, phase=Phase.LOST), device("order", count=5)],
    )

    status = class_status(snap, snap.classes["h100"])

    # The tainted node is not the class's (it tolerates nothing); Lost and Pending hold no units.
    assert (status["units"], status["held"], status["free"]) == (12, 4, 8)
    [available] = status["conditions"]
    assert (available["status"], available["reason"]) == ("True", "UnitsFree")
    assert available["message"] == "8 units free on 2 eligible node(s); the most on node n1 (5)"


def test_a_class_with_every_unit_held_or_no_eligible_node_or_deleting_is_not_available_and_says_why() -> None:
    full = snapshot(devices=[device("a", count=8, phase=Phase.BOUND, node="n1")])
    assert conditions_by_type(class_status(full, full.classes["h100"])["conditions"])["Available"] == (
        "False", "AllHeld", "all 8 units on 1 eligible node(s) are held or in use")

    stale = snapshot(nodes=[node("n1")], inventories=[inventory("n1", last_report=NOW - timedelta(hours=1))])
    assert conditions_by_type(class_status(stale, stale.classes["h100"])["conditions"])["Available"][:2] == (
        "False", "NoEligibleNode")

    deleting = snapshot(classes=[gpu_class(deleting=True)])
    assert conditions_by_type(class_status(deleting, deleting.classes["h100"])["conditions"])["Available"][:2] == (
        "False", "Deleting")


def test_node_conditions_say_eligible_or_the_first_problem() -> None:
    snap = snapshot(nodes=[node("ok"), node("cordoned", unschedulable=True), node("down", ready=False),
                           node("stale")],
                    inventories=[inventory("ok"), inventory("cordoned"), inventory("down"),
                                 inventory("stale", last_report=NOW - timedelta(hours=1)), inventory("gone")])

    eligible = {n: conditions_by_type(node_conditions(snap, n))["Eligible"][:2]
                for n in ("ok", "cordoned", "down", "stale", "gone")}

    assert eligible == {"ok": ("True", "Eligible"), "cordoned": ("False", "NodeCordoned"),
                        "down": ("False", "NodeNotReady"), "stale": ("False", "ReportStale"),
                        "gone": ("False", "NodeGone")}


def test_capacity_exceeded_names_served_held_and_used_by_other_pods() -> None:
    snap = snapshot(nodes=[node("n1")], inventories=[inventory("n1", {H100: 2})],
                    devices=[device("a", count=2, phase=Phase.BOUND, node="n1")],
                    pods=[pod("raw", node_name="n1", requests={H100: 1})])

    exceeded = conditions_by_type(node_conditions(snap, "n1"))["CapacityExceeded"]

    assert exceeded == ("True", "CapacityLost",
                        f"{H100}: serves 2, 2 held by Bound devices, 1 in use by other pods")
    within = snapshot(devices=[device("a", count=2, phase=Phase.BOUND, node="n1")])
    assert conditions_by_type(node_conditions(within, "n1"))["CapacityExceeded"] == (
        "False", "WithinCapacity", f"{H100}: 2 of 8 held")


def test_a_transition_time_moves_only_when_the_status_does() -> None:
    snap = snapshot(nodes=[node("n1")], inventories=[inventory("n1")])
    eligible, exceeded = node_conditions(snap, "n1")
    assert (eligible["type"], eligible["status"]) == ("Eligible", "True")
    assert (exceeded["type"], exceeded["status"]) == ("CapacityExceeded", "False")
    before = [{**eligible, "message": "an older message", "lastTransitionTime": "2026-01-01T00:00:00Z"},
              {"type": "Other", "status": "True"},
              {**exceeded, "status": "True", "reason": "CapacityLost", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    gpunode = {"metadata": {"name": "n1", "resourceVersion": "9"}, "status": {"conditions": before}}

    (write,) = report_writes(snap, [], [gpunode], now=NOW)

    same, other, flipped = write.status["conditions"]
    assert same == {**eligible, "lastTransitionTime": "2026-01-01T00:00:00Z"}, "same status: its time kept"
    assert flipped == {**exceeded, "lastTransitionTime": "2026-12-02T12:00:00Z"}, "status moved: now"
    assert other == {"type": "Other", "status": "True"}  # someone else's condition is kept, in its place


def test_report_writes_carry_the_resource_version_and_nothing_is_written_twice() -> None:
    snap = snapshot()
    gpu_class_obj = {"metadata": {"name": "h100", "resourceVersion": "7"}, "status": {}}
    gpunode_obj = {"metadata": {"name": "n1", "resourceVersion": "9"}, "status": {"devices": []}}

    writes = report_writes(snap, [gpu_class_obj], [gpunode_obj], now=NOW)

    assert [(w.what, w.resource_version) for w in writes] == [("GPUClass h100", "7"), ("GPUNode n1", "9")]
    assert set(writes[1].status) == {"conditions"}  # the agent's fields are never in the patch
    # Once written, the same report is no change.
    written_class = {**gpu_class_obj, "status": dict(writes[0].status)}
    written_node = {**gpunode_obj, "status": {"devices": [], **writes[1].status}}
    assert report_writes(snap, [written_class], [written_node], now=NOW + timedelta(minutes=5)) == ()


def test_the_reports_judged_again_are_those_the_change_log_may_have_moved() -> None:
    """The reports work's keys: after a rebuild every report; then the GPUNodes the model's change log names,
    and the classes of the resource names whose availability it names; nothing when nothing changed."""
    model = ModelTables()
    node_views, inventories = gpu_nodes(("n1", 8), ("n2", 8))
    first = model.rebuild(now=NOW, classes=[gpu_class()], devices=[], nodes=node_views, inventories=inventories,
                          pods=[], vmis=[], namespaces=[])
    assert reports.keys_changed(first, None) == [("GPUClass", "h100"), ("GPUNode", "n1"), ("GPUNode", "n2")]
    same = model.update(now=NOW, devices={})
    assert reports.keys_changed(same, same.changes_since(first)) == []
    held = model.update(now=NOW, devices={("tenant-a", "d1"): device("d1", phase=Phase.BOUND, node="n1")})
    assert reports.keys_changed(held, held.changes_since(same)) == [("GPUClass", "h100"), ("GPUNode", "n1")]


def test_a_dra_class_says_whether_its_offer_is_published_and_what_keeps_devices_out() -> None:
    from cozygpu.devcluster import dra_driver
    from cozygpu.views.build import build_snapshot

    name = f"deviceclass.resource.kubernetes.io/{dra_driver.DEVICE_CLASS}"
    dra_class = {"metadata": {"name": "dra"}, "spec": {"mode": "Passthrough", "resourceName": name, "source": {
        "dra": {"deviceClassName": dra_driver.DEVICE_CLASS}}}}
    tainted = dra_driver.resource_slice("n1", "uid-n1", 2)
    tainted["spec"]["devices"][1]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}]
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    nodes = [{"metadata": {"name": "n1", "labels": {}}, "status": ready}]
    published = build_snapshot(now=NOW, classes=[dra_class], nodes=nodes, slices=[tainted],
                               device_classes=[dra_driver.device_class()])
    shown = conditions_by_type(class_status(published, published.classes["dra"])["conditions"])
    assert shown["Available"][:2] == ("True", "UnitsFree")
    assert shown["OfferPublished"] == (
        "False", "DevicesLeftOut", "device 'gpu-vfio-1' of pool 'n1' is tainted gpu.nvidia.com/xid=79:NoExecute")
    gone = build_snapshot(now=NOW, classes=[dra_class], nodes=nodes, slices=[tainted])
    shown = conditions_by_type(class_status(gone, gone.classes["dra"])["conditions"])
    assert shown["Available"] == ("False", "NoEligibleNode", f"no Ready, eligible node has devices of DeviceClass "
                                  f"{dra_driver.DEVICE_CLASS} published that the offer matches")
    assert shown["OfferPublished"] == ("False", "DevicesLeftOut", "its DeviceClass does not exist")
    plugin = conditions_by_type(class_status(snapshot(), snapshot().classes["h100"])["conditions"])
    assert "OfferPublished" not in plugin, "a device-plugin class has no DRA offer to report"
