"""The snapshot builder reads our CRDs' fields and the Kubernetes and KubeVirt fields the model needs."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cozygpu.model.catalog import order_refusal
from cozygpu.model.pods import pod_requests, whole_requests
from cozygpu.model.snapshot import Attachment, Mode, OnCordon, Phase, PodPhase, Taint, Toleration
from cozygpu.views.build import ViewMemo, build_snapshot
from cozygpu.views.decode_pods import pod_resources

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
H100 = "nvidia.com/GH100_H100_SXM5_80GB"
STAMP = "2026-12-02T11:59:00Z"


def gpu_class(name: str = "h100", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpu.cozystack.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": {"vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "resourceName": H100, **spec},
    }


def gpu_device(name: str, *, namespace: str = "tenant-a", count: int = 1, **status: Any) -> dict[str, Any]:
    return {
        "kind": "GPUDevice",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "creationTimestamp": STAMP},
        "spec": {"className": "h100", "count": count},
        "status": status,
    }


def gpu_node(name: str, *devices: tuple[str, int], last_report: str = STAMP) -> dict[str, Any]:
    return {
        "kind": "GPUNode",
        "metadata": {"name": name},
        "status": {
            "devices": [
                {"address": f"0000:{i:02x}:00.0", "vendorID": "10de", "resourceName": r, "allocatable": a}
                for i, (r, a) in enumerate(devices)
            ],
            "resourceNames": sorted({r for r, _ in devices}),
            "agent": {"version": "0.1.0", "lastReport": last_report},
        },
    }


def k8s_node(name: str, *, ready: str = "True", **spec: Any) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}]},
    }


def test_classes_and_devices_are_read_with_the_crd_field_names() -> None:
    snap = build_snapshot(
        now=NOW,
        classes=[
            gpu_class(
                maxCount=2,
                onCordon="Stay",
                nodeSelector={"matchLabels": {"gpu": "h100"}},
                tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            ),
            gpu_class("a10-24q", mode="VGPU", profile="A10-24Q", resourceName="nvidia.com/A10-24Q"),
        ],
        devices=[
            gpu_device(
                "held",
                count=2,
                phase="Bound",
                nodeName="n1",
                attachment={"vmi": "vm1", "uid": "vmi-uid", "attachedAt": STAMP, "requestId": "r1"},
                bindRequest={"id": "r1", "vmi": "vm1", "time": STAMP},
                bindAnswer={"id": "r1", "result": "Succeeded", "node": "n1", "time": STAMP},
            ),
            gpu_device("fresh"),
        ],
    )
    h100 = snap.classes["h100"]
    assert (h100.mode, h100.max_count, h100.on_cordon) == (Mode.PASSTHROUGH, 2, OnCordon.STAY)
    assert h100.node_selector is not None
    assert h100.node_selector.match_labels == (("gpu", "h100"),)
    assert h100.tolerations == (Toleration(key="dedicated", operator="Exists", effect="NoSchedule"),)
    assert snap.classes["a10-24q"].mode is Mode.VGPU
    held = snap.devices[("tenant-a", "held")]
    assert (held.phase, held.node_name, held.count) == (Phase.BOUND, "n1", 2)
    assert held.attachment == Attachment(
        vmi="vm1", uid="vmi-uid", attached_at=datetime(2026, 12, 2, 11, 59, tzinfo=UTC), request_id="r1"
    )
    assert not held.unanswered_request
    fresh = snap.devices[("tenant-a", "fresh")]
    assert (fresh.phase, fresh.node_name, fresh.attachment) == (Phase.PENDING, None, None)
    assert snap.devices_by_node == {"n1": (("tenant-a", "held"),)}
    assert snap.devices_by_vmi == {("tenant-a", "vm1"): (("tenant-a", "held"),)}


def test_a_template_device_is_known_by_its_label() -> None:
    obj = gpu_device("vm1-gpu")
    obj["metadata"]["labels"] = {"gpu.cozystack.io/template-device": ""}
    snap = build_snapshot(now=NOW, classes=[gpu_class()], devices=[obj])
    assert snap.devices[("tenant-a", "vm1-gpu")].template


def test_gpunodes_serve_the_sum_of_allocatable_and_a_stale_report_serves_nothing() -> None:
    snap = build_snapshot(
        now=NOW,
        classes=[gpu_class()],
        gpunodes=[
            gpu_node("n1", (H100, 1), (H100, 1), ("nvidia.com/A10-24Q", 4)),
            gpu_node("n2", (H100, 8), last_report=(NOW - timedelta(hours=1)).isoformat()),
        ],
        nodes=[k8s_node("n1"), k8s_node("n2")],
    )
    assert snap.inventories["n1"].served == {H100: 2, "nvidia.com/A10-24Q": 4}
    assert snap.inventories["n1"].fresh
    assert not snap.inventories["n2"].fresh
    assert "nvidia.com/A10-24Q" in snap.effective_names
    assert snap.availability["h100"].free_in_cluster == 2


def test_nodes_are_read_for_ready_cordon_and_taints() -> None:
    snap = build_snapshot(
        now=NOW,
        nodes=[
            k8s_node("n1", unschedulable=True, taints=[{"key": "k", "value": "v", "effect": "NoExecute"}]),
            k8s_node("n2", ready="Unknown"),
        ],
    )
    n1, n2 = snap.nodes["n1"], snap.nodes["n2"]
    assert n1.unschedulable
    assert n1.ready
    assert n1.taints == (Taint(key="k", value="v", effect="NoExecute"),)
    assert not n2.ready
    assert not n2.unschedulable


def test_pod_requests_use_the_scheduler_arithmetic_and_launchers_come_from_active_pods() -> None:
    raw_pod = {
        "metadata": {"name": "trainer", "namespace": "tenant-a", "uid": "p1"},
        "spec": {
            "nodeName": "n1",
            "initContainers": [
                {"name": "warm", "restartPolicy": "Always", "resources": {"limits": {H100: "1"}}},
                {"name": "setup", "resources": {"requests": {H100: "2"}, "limits": {H100: "2"}}},
            ],
            "containers": [{"name": "main", "resources": {"limits": {H100: "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    launcher = {
        "metadata": {"name": "virt-launcher-vm1-abcde", "namespace": "tenant-a", "uid": "p2"},
        "spec": {"nodeName": "n1", "containers": [{"name": "compute", "resources": {"limits": {H100: "1"}}}]},
        "status": {"phase": "Running"},
    }
    plain = {
        "metadata": {"name": "web", "namespace": "tenant-a", "uid": "p3"},
        "spec": {"containers": [{"name": "web", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running"},
    }
    vmi = {
        "metadata": {"name": "vm1", "namespace": "tenant-a", "uid": "vmi-uid"},
        "spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}], "nodeSelector": {"zone": "a"}},
        "status": {"phase": "Running", "nodeName": "n1", "activePods": {"p2": "n1"}},
    }
    snap = build_snapshot(
        now=NOW,
        classes=[gpu_class()],
        devices=[gpu_device("held", phase="Bound", nodeName="n1", attachment={"vmi": "vm1", "uid": "vmi-uid"})],
        gpunodes=[gpu_node("n1", (H100, 8))],
        nodes=[k8s_node("n1")],
        pods=[raw_pod, launcher, plain],
        vmis=[vmi],
    )
    assert snap.pods["p1"].requests == {H100: 3}
    assert snap.pods["p1"].phase is PodPhase.RUNNING
    assert "p3" not in snap.pods
    assert snap.launchers == {"p2": ("tenant-a", "vm1")}
    assert snap.vmis[("tenant-a", "vm1")].node_selector == {"zone": "a"}
    assert snap.capacity["n1"][H100].raw_in_use == 3
    assert snap.capacity["n1"][H100].held == 1


def test_only_the_tenant_quota_resource_quota_declares_budgets() -> None:
    quotas = [
        {
            "metadata": {"name": "tenant-quota", "namespace": "tenant-a"},
            "spec": {"hard": {"requests.gpu.cozystack.io/h100": "1", "limits.gpu.cozystack.io/h100": "1"}},
        },
        {
            "metadata": {"name": "tenant-quota-allocated", "namespace": "tenant-a"},
            "spec": {"hard": {"requests.gpu.cozystack.io/total": "0"}},
        },
    ]
    snap = build_snapshot(
        now=NOW,
        classes=[gpu_class()],
        gpunodes=[gpu_node("n1", (H100, 8))],
        nodes=[k8s_node("n1")],
        quotas=quotas,
    )
    assert snap.budgets["tenant-a"].total is None
    refusal = order_refusal(snap, "tenant-a", "h100", 2)
    assert refusal is not None
    assert refusal.key == "gpu.cozystack.io/h100"


def test_the_permitted_table_is_read_from_the_kubevirt_cr_and_a_null_table_is_none() -> None:
    kubevirt = {
        "metadata": {"name": "kubevirt", "namespace": "cozy-kubevirt"},
        "spec": {
            "configuration": {
                "permittedHostDevices": {
                    "pciHostDevices": [
                        {"pciVendorSelector": "10DE:2330", "resourceName": H100, "externalResourceProvider": True},
                        {"pciVendorSelector": "15B3:101E", "resourceName": "mellanox.com/cx7_vf"},
                    ],
                    "mediatedDevices": [{"mdevNameSelector": "NVIDIA A10-24Q", "resourceName": "nvidia.com/A10-24Q"}],
                }
            }
        },
    }
    snap = build_snapshot(now=NOW, kubevirts=[kubevirt], hoster_names=["example.com/gpu"])
    assert snap.permitted is not None
    assert len(snap.permitted.pci) == 2
    assert len(snap.permitted.mediated) == 1
    assert snap.effective_names == {H100, "nvidia.com/A10-24Q", "example.com/gpu"}
    empty = {"metadata": {"name": "kubevirt"}, "spec": {"configuration": {"permittedHostDevices": None}}}
    assert build_snapshot(now=NOW, kubevirts=[empty]).permitted is None


def test_objects_that_cannot_be_read_are_left_out_and_reported() -> None:
    problems: list[tuple[str, str]] = []
    bad_pod = {
        "metadata": {"name": "p", "namespace": "tenant-a", "uid": "p"},
        "spec": {"containers": [{"resources": {"limits": {H100: "lots"}}}]},
    }
    snap = build_snapshot(
        now=NOW,
        classes=[gpu_class("weird", mode="Magic"), gpu_class()],
        devices=[{"metadata": {"name": "d", "namespace": "tenant-a"}, "spec": {"className": "h100"}}],
        pods=[bad_pod],
        on_invalid=lambda kind, obj, problem: problems.append((kind, problem)),
    )
    assert set(snap.classes) == {"h100"}
    assert not snap.devices
    assert not snap.pods
    assert [kind for kind, _ in problems] == ["GPUClass", "GPUDevice", "Pod"]


def test_tenant_namespaces_carry_their_labels_into_the_snapshot() -> None:
    snap = build_snapshot(
        now=NOW,
        namespaces=[
            {"metadata": {"name": "tenant-a", "labels": {"gpu.cozystack.io/vgpu-entitled": "true"}}},
            {"metadata": {"name": "tenant-a-b"}},
        ],
    )
    assert snap.namespaces["tenant-a"].labels["gpu.cozystack.io/vgpu-entitled"] == "true"
    assert snap.children["tenant-a"] == ("tenant-a-b",)
    assert snap.children["tenant-root"] == ("tenant-a",)


def test_a_memo_reuses_the_view_of_an_unchanged_object_and_converts_a_changed_one() -> None:
    memo = ViewMemo()
    first = gpu_device("d")
    first["metadata"]["resourceVersion"] = "1"
    one = build_snapshot(now=NOW, classes=[gpu_class()], devices=[first], memo=memo)
    again = build_snapshot(now=NOW, classes=[gpu_class()], devices=[first], memo=memo)
    assert again.devices[("tenant-a", "d")] is one.devices[("tenant-a", "d")]
    changed = gpu_device("d", phase="Bound", nodeName="n1")
    changed["metadata"]["resourceVersion"] = "2"
    later = build_snapshot(now=NOW, classes=[gpu_class()], devices=[changed], memo=memo)
    assert later.devices[("tenant-a", "d")].phase is Phase.BOUND


def test_a_memo_forgets_deleted_objects_and_reports_an_invalid_one_on_every_build() -> None:
    memo = ViewMemo()
    broken = {"metadata": {"name": "bad", "namespace": "tenant-a", "resourceVersion": "5"}, "spec": {}}
    kept = gpu_device("d")
    kept["metadata"]["resourceVersion"] = "1"
    problems: list[str] = []
    for _ in range(2):
        build_snapshot(now=NOW, devices=[kept, broken], memo=memo, on_invalid=lambda k, o, p: problems.append(p))
    assert len(problems) == 2
    assert len(memo) == 2
    build_snapshot(now=NOW, devices=[], memo=memo)
    assert len(memo) == 0


def test_pod_requests_read_the_same_on_the_plain_path_and_the_general_one() -> None:
    def limits(**values: Any) -> dict[str, Any]:
        return {"resources": {"limits": {H100 if k == "gpu" else f"example.com/{k}": v for k, v in values.items()}}}

    request_wins = {"resources": {"requests": {H100: "1"}, "limits": {H100: "3"}}}
    specs: list[dict[str, Any]] = [
        {"containers": [limits(gpu="1"), limits(gpu=2), request_wins]},
        {"containers": [limits(gpu="0", x="2"), {"name": "no-resources"}, "not a container"]},
        {"containers": [limits(gpu="500m")]},  # a fraction rounds up
        {"containers": [limits(gpu="2")], "overhead": {H100: "1"}},
        {"containers": [limits(gpu="1")], "initContainers": [{"restartPolicy": "Always", **limits(gpu="1")}]},
        {"containers": [limits(gpu="1")], "initContainers": [limits(gpu="4")]},
    ]
    pods = [
        {"metadata": {"name": f"p{i}", "namespace": "tenant-a", "uid": f"p{i}"}, "spec": spec}
        for i, spec in enumerate(specs)
    ]
    snap = build_snapshot(now=NOW, pods=pods)
    read = [snap.pods[f"p{i}"].requests for i in range(len(specs))]
    assert read == [whole_requests(pod_requests(pod_resources(spec, extended_only=True))) for spec in specs]
    assert read == [{H100: 4}, {"example.com/x": 2}, {H100: 1}, {H100: 3}, {H100: 2}, {H100: 4}]


def test_a_build_pauses_the_garbage_collector_and_leaves_it_as_it_found_it() -> None:
    seen: list[bool] = []

    def note(kind: str, obj: Any, problem: str) -> None:
        seen.append(gc.isenabled())

    def fail(kind: str, obj: Any, problem: str) -> None:
        raise RuntimeError("handler failed")

    broken = [{"metadata": {"name": "d", "namespace": "tenant-a"}, "spec": {}}]
    was_enabled = gc.isenabled()
    try:
        gc.enable()
        build_snapshot(now=NOW, devices=broken, on_invalid=note)
        assert seen == [False]
        assert gc.isenabled()
        with pytest.raises(RuntimeError):
            build_snapshot(now=NOW, devices=broken, on_invalid=fail)
        assert gc.isenabled()
        gc.disable()
        build_snapshot(now=NOW, devices=broken, on_invalid=note)
        assert seen == [False, False]
        assert not gc.isenabled()
    finally:
        if was_enabled:
            gc.enable()
        else:
            gc.disable()
