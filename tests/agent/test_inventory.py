"""Placing device-plugin IDs by shape and counting per function: sysfs trees + kubelet views -> status."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cozygpu.agent.inventory import (
    NotGpu,
    NvmlGpu,
    OnGpu,
    PodKey,
    PodState,
    PodVerdict,
    Unplaced,
    build_inventory,
    place,
    pods_to_look_up,
)
from cozygpu.agent.kubelet import DeviceIDs, KubeletView, PodDevices
from cozygpu.agent.sysfs import read_sysfs
from cozygpu.devcluster import sysfs_tree as layouts
from cozygpu.devcluster.sysfs_tree import SysfsTree

KVM = "devices.kubevirt.io/kvm"


def kubelet_view(
    allocatable: Sequence[tuple[str, str] | tuple[str, str, tuple[int, ...]]] = (),
    pods: Mapping[PodKey, Sequence[tuple[str, str]]] | None = None,
) -> KubeletView:
    """Entries as kubelet sends them: one per device, once per NUMA node when given."""
    entries = []
    for resource, device_id, *numa in allocatable:
        nodes = numa[0] if numa else ()
        entries += [DeviceIDs(resource, (device_id,), (n,)) for n in nodes] or [DeviceIDs(resource, (device_id,))]
    listed = tuple(
        PodDevices(namespace, name, tuple(DeviceIDs(resource, (device_id,)) for resource, device_id in devices))
        for (namespace, name), devices in (pods or {}).items()
    )
    return KubeletView(allocatable=tuple(entries), pods=listed)


def status(tree: SysfsTree, view: KubeletView, pods: Mapping[PodKey, PodState] | None = None) -> dict[str, Any]:
    inventory = build_inventory(read_sysfs(tree.root), view, pods or {})
    return {**inventory.to_status(), "problems": list(inventory.problems)}


def by_address(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    devices: list[dict[str, Any]] = result["devices"]
    assert len({d["address"] for d in devices}) == len(devices), "one entry per function expected here"
    return {d["address"]: d for d in devices}


# -- placing IDs by shape -----------------------------------------------------------------


def test_an_iommu_group_lands_on_its_vfio_gpu_not_on_the_audio_function_beside_it(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    view = read_sysfs(tree.root)

    assert place(view, "30") == OnGpu(hgx.gpus[0])
    assert place(view, "120") == OnGpu(hgx.gpus[1])


def test_a_vfio_nvswitch_group_and_a_connectx_vf_are_no_gpus(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    cx = layouts.connectx_vf(tree)
    view = read_sysfs(tree.root)

    assert place(view, str(hgx.nvswitch_group)) == NotGpu()
    assert place(view, str(cx.vf_group)) == NotGpu()
    assert place(view, cx.vf) == NotGpu()


def test_a_group_counts_only_through_vfio_members_so_a_plain_index_is_not_read_as_a_group(tree: SysfsTree) -> None:
    layouts.container_plugin_gpu(tree)  # on nvidia, in group 0
    layouts.unbound_gpu(tree)
    view = read_sysfs(tree.root)

    assert isinstance(place(view, "0"), Unplaced)
    assert isinstance(place(view, str(layouts.UNBOUND_GROUP)), Unplaced)
    assert place(view, "7") == Unplaced("no IOMMU group 7 in sysfs")


def test_pci_addresses_land_on_their_function_whatever_its_driver(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    vgpu = layouts.vgpu_vfs(tree)
    view = read_sysfs(tree.root)

    assert place(view, hgx.gpus[1]) == OnGpu(hgx.gpus[1])
    assert place(view, vgpu.vfs[0].upper()) == OnGpu(vgpu.vfs[0])
    assert place(view, "9a:00.0") == OnGpu(hgx.gpus[1])  # no domain: the first
    assert place(view, "0000:77:00.0") == Unplaced("no PCI function 0000:77:00.0 in sysfs")


def test_mdev_uuids_and_mdev_groups_land_on_the_parent(tree: SysfsTree) -> None:
    layout = layouts.mdev_parent(tree)
    view = read_sysfs(tree.root)

    assert place(view, layout.small[0]) == OnGpu(layout.parent)
    assert place(view, layout.small[0].upper()) == OnGpu(layout.parent)
    assert place(view, str(layout.big_groups[0])) == OnGpu(layout.parent)
    assert place(view, "00000000-0000-0000-0000-000000000000") == Unplaced(
        "no mdev 00000000-0000-0000-0000-000000000000 in sysfs")


def test_a_vgpu_vf_group_counts_only_while_a_vgpu_is_created_on_it(tree: SysfsTree) -> None:
    layout = layouts.vgpu_vfs(tree)
    view = read_sysfs(tree.root)

    assert place(view, str(layout.groups[0])) == OnGpu(layout.vfs[0])
    assert isinstance(place(view, str(layout.groups[1])), Unplaced)  # current_vgpu_type 0
    assert place(view, str(layout.groups[2])) == OnGpu(layout.vfs[2])


def test_nvml_uuids_of_the_container_plugin_are_gpus_that_cannot_be_placed(tree: SysfsTree) -> None:
    view = read_sysfs(tree.root)

    assert place(view, layouts.CONTAINER_UUID) == NvmlGpu()
    assert place(view, "MIG-4a2c9a8e-1c1e-5a8b-9e5e-3c7f0e9d2b11") == NvmlGpu()
    assert place(view, layouts.CONTAINER_UUID + "::3") == NvmlGpu()  # a time-slicing replica


def test_a_group_with_two_vfio_gpus_counts_once_and_says_so(tree: SysfsTree) -> None:
    tree.function("0000:21:00.0", vendor="10de", device="2236", pci_class="0x030200", driver="vfio-pci",
                  iommu_group=44)
    tree.function("0000:22:00.0", vendor="10de", device="2236", pci_class="0x030200", driver="vfio-pci",
                  iommu_group=44)
    placement = place(read_sysfs(tree.root), "44")

    assert isinstance(placement, OnGpu)
    assert placement.address == "0000:21:00.0"
    assert placement.note is not None
    assert "0000:21:00.0, 0000:22:00.0" in placement.note


# -- counting and naming ------------------------------------------------------------------


def test_passthrough_h100s_report_one_allocatable_each_by_group(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    view = kubelet_view([(hgx.resource, "30", (0,)), (hgx.resource, "120", (1,)), (KVM, "kvm0")])

    result = status(tree, view)

    assert result["resourceNames"] == [hgx.resource]
    assert (result["deviceCount"], result["allocatable"]) == (2, 2)
    assert result["devices"] == [
        {"address": "0000:18:00.0", "vendorID": "10de", "deviceID": "2330", "class": "0x030200",
         "driver": "vfio-pci", "iommuGroup": 30, "numaNode": 0, "resourceName": hgx.resource,
         "kind": "Passthrough", "allocatable": 1, "allocated": 0},
        {"address": "0000:9a:00.0", "vendorID": "10de", "deviceID": "2330", "class": "0x030200",
         "driver": "vfio-pci", "iommuGroup": 120, "numaNode": 1, "resourceName": hgx.resource,
         "kind": "Passthrough", "allocatable": 1, "allocated": 0},
    ]
    assert result["problems"] == []


def test_an_id_repeated_for_two_numa_nodes_counts_once(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    view = kubelet_view([(hgx.resource, hgx.gpus[0], (0, 1)), (hgx.resource, hgx.gpus[1], (0, 1))])

    devices = by_address(status(tree, view))

    assert [devices[gpu]["allocatable"] for gpu in hgx.gpus] == [1, 1]


def test_an_unhealthy_device_missing_from_allocatable_leaves_its_function_at_zero(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    view = kubelet_view([(hgx.resource, "120")])  # group 30's device went unhealthy

    devices = by_address(status(tree, view))

    assert (devices[hgx.gpus[0]]["allocatable"], devices[hgx.gpus[0]]["resourceName"]) == (0, "")
    assert (devices[hgx.gpus[1]]["allocatable"], devices[hgx.gpus[1]]["resourceName"]) == (1, hgx.resource)


def test_an_mdev_parent_counts_its_instances_per_resource_name(tree: SysfsTree) -> None:
    layout = layouts.mdev_parent(tree)
    # KubeVirt's mdev plugin: IOMMU groups of the mdevs; one small instance is unhealthy.
    allocatable = [(layout.small_resource, str(g)) for g in layout.small_groups[:2]]
    # NVIDIA's kubevirt plugin: the mdev UUIDs.
    allocatable += [(layout.big_resource, uuid) for uuid in layout.big]

    result = status(tree, kubelet_view(allocatable))

    assert result["resourceNames"] == [layout.small_resource, layout.big_resource]
    small, big = result["devices"]
    assert (small["address"], small["resourceName"], small["allocatable"]) == (
        layout.parent, layout.small_resource, 2)
    assert (big["address"], big["resourceName"], big["allocatable"]) == (layout.parent, layout.big_resource, 2)
    assert small["kind"] == big["kind"] == "MdevParent"
    assert small["mdevTypes"] == [
        {"id": "nvidia-222", "name": "GRID T4-1Q", "availableInstances": 9, "instances": 3},
        {"id": "nvidia-223", "name": "GRID T4-2Q", "availableInstances": 2, "instances": 2},
        {"id": "nvidia-230", "name": "nvidia-230", "availableInstances": 0, "instances": 0},
    ]
    assert (result["deviceCount"], result["allocatable"]) == (2, 4)  # entries, not functions
    assert result["problems"] == []


def test_vgpu_vfs_count_through_groups_and_addresses_and_report_their_type(tree: SysfsTree) -> None:
    layout = layouts.vgpu_vfs(tree)
    # KubeVirt 1.9 by group for the first, a vendor-specific plugin by address for the third.
    view = kubelet_view([(layout.resource, str(layout.groups[0])), (layout.resource, layout.vfs[2])])

    devices = by_address(status(tree, view))

    first, idle, third = (devices[vf] for vf in layout.vfs)
    assert (first["kind"], first["physfn"], first["vgpuType"], first["allocatable"]) == (
        "SRIOVVF", layout.pf, "NVIDIA L40S-24Q", 1)
    assert first["creatableVGPUTypes"] == ["NVIDIA L40S-24Q", "NVIDIA L40S-48Q"]
    assert "vgpuType" not in idle
    assert idle["allocatable"] == 0
    assert (third["vgpuType"], third["allocatable"]) == ("1415", 1)  # no longer creatable: its ID stands in
    pf = devices[layout.pf]
    assert (pf["kind"], pf["driver"], pf["allocatable"]) == ("Passthrough", "nvidia", 0)
    assert "physfn" not in pf
    assert "vgpuType" not in pf


def test_nvml_ids_add_their_resource_name_but_place_nothing(tree: SysfsTree) -> None:
    layouts.container_plugin_gpu(tree)
    view = kubelet_view([(layouts.CONTAINER_RESOURCE, layouts.CONTAINER_UUID)])

    result = status(tree, view)

    assert result["resourceNames"] == [layouts.CONTAINER_RESOURCE]
    (gpu,) = result["devices"]
    assert (gpu["address"], gpu["driver"], gpu["resourceName"], gpu["allocatable"]) == (
        layouts.CONTAINER_GPU, "nvidia", "", 0)
    assert result["problems"] == []


def test_an_unbound_gpu_is_listed_with_nothing_allocatable(tree: SysfsTree) -> None:
    layouts.unbound_gpu(tree)

    (gpu,) = status(tree, kubelet_view())["devices"]

    assert (gpu["driver"], gpu["iommuGroup"], gpu["resourceName"], gpu["allocatable"]) == (
        "", layouts.UNBOUND_GROUP, "", 0)


def test_a_connectx_vf_by_group_or_by_address_is_no_gpu_resource(tree: SysfsTree) -> None:
    cx = layouts.connectx_vf(tree)
    hgx = layouts.hgx_passthrough(tree)
    view = kubelet_view([
        (cx.resource, str(cx.vf_group)), ("intel.com/cx_vfs", cx.vf), (KVM, "kvm0"),
        (hgx.resource, "30"),
    ])

    result = status(tree, view)

    assert result["resourceNames"] == [hgx.resource]
    assert set(by_address(result)) == set(hgx.gpus)
    assert result["problems"] == []


def test_ids_of_a_gpu_resource_that_cannot_be_placed_are_reported(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    layouts.unbound_gpu(tree)
    view = kubelet_view([(hgx.resource, "30"), (hgx.resource, str(layouts.UNBOUND_GROUP)),
                         (hgx.resource, "0000:77:00.0")])

    result = status(tree, view)

    assert result["problems"] == [
        f"{hgx.resource}: device '0000:77:00.0' cannot be placed: no PCI function 0000:77:00.0 in sysfs",
        f"{hgx.resource}: device '90' cannot be placed: IOMMU group 90 has no member bound to vfio, "
        "no active vGPU VF and no mdev",
    ]
    assert by_address(result)[hgx.gpus[0]]["allocatable"] == 1


def test_a_function_advertised_under_two_names_is_reported(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    view = kubelet_view([(hgx.resource, "30"), ("nvidia.com/H100", hgx.gpus[0])])

    result = status(tree, view)

    entries = [d for d in result["devices"] if d["address"] == hgx.gpus[0]]
    assert [(d["resourceName"], d["allocatable"]) for d in entries] == [
        (hgx.resource, 1), ("nvidia.com/H100", 1)]
    assert result["problems"] == [
        f"{hgx.gpus[0]} is advertised under several resource names (nvidia.com/GH100_H100_SXM5_80GB, "
        "nvidia.com/H100): two plugins may hand it out twice"]


# -- pods ------------------------------------------------------------------------------------


def test_only_pods_holding_gpu_devices_are_looked_up(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    layouts.container_plugin_gpu(tree)
    view = kubelet_view(pods={
        ("t", "vm-launcher"): [(hgx.resource, "30"), (KVM, "kvm3")],
        ("t", "just-kvm"): [(KVM, "kvm4")],
        ("t", "container"): [(layouts.CONTAINER_RESOURCE, layouts.CONTAINER_UUID)],
    })

    assert pods_to_look_up(read_sysfs(tree.root), view) == [("t", "vm-launcher")]


def test_a_completed_pod_still_listed_with_devices_holds_nothing(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    view = kubelet_view(
        [(hgx.resource, "30"), (hgx.resource, "120")],
        pods={("t", "done"): [(hgx.resource, "30")], ("t", "running"): [(hgx.resource, "120")]},
    )
    pods = {("t", "done"): PodState(PodVerdict.FINAL, uid="u1"), ("t", "running"): PodState(PodVerdict.LIVE, uid="u2")}

    devices = by_address(status(tree, view, pods))

    assert [(devices[g]["allocatable"], devices[g]["allocated"]) for g in hgx.gpus] == [(1, 0), (1, 1)]


def test_pods_gone_or_now_elsewhere_hold_nothing_and_unknown_ones_hold_theirs_with_a_problem(
    tree: SysfsTree,
) -> None:
    layout = layouts.mdev_parent(tree)
    view = kubelet_view(
        [(layout.small_resource, uuid) for uuid in layout.small],
        pods={("t", "gone"): [(layout.small_resource, layout.small[0])],
              ("t", "moved"): [(layout.small_resource, layout.small[1])],
              ("t", "unknown"): [(layout.small_resource, layout.small[2])]},
    )
    pods = {("t", "gone"): PodState(PodVerdict.GONE), ("t", "moved"): PodState(PodVerdict.ELSEWHERE),
            ("t", "unknown"): PodState(PodVerdict.UNKNOWN, detail="lookup failed: 503")}

    result = status(tree, view, pods)

    (parent,) = result["devices"]
    assert (parent["allocatable"], parent["allocated"]) == (3, 1)
    assert result["problems"] == ["pod t/unknown: lookup failed: 503; its devices count as held"]


def test_a_device_held_while_unhealthy_counts_as_allocated_and_names_its_function(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    view = kubelet_view([], pods={("t", "vm"): [(hgx.resource, "30")]})

    result = status(tree, view, {("t", "vm"): PodState(PodVerdict.LIVE)})

    gpu = by_address(result)[hgx.gpus[0]]
    assert (gpu["resourceName"], gpu["allocatable"], gpu["allocated"]) == (hgx.resource, 0, 1)
    assert result["resourceNames"] == [hgx.resource]


def test_a_whole_node_with_every_layout_reports_each_gpu_function_once_per_resource(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    mdev = layouts.mdev_parent(tree)
    vgpu = layouts.vgpu_vfs(tree)
    layouts.unbound_gpu(tree)
    layouts.container_plugin_gpu(tree)
    cx = layouts.connectx_vf(tree)
    view = kubelet_view([
        (hgx.resource, "30", (0,)), (hgx.resource, "120", (1,)),
        *[(mdev.small_resource, str(g)) for g in mdev.small_groups],
        (vgpu.resource, str(vgpu.groups[0])),
        (layouts.CONTAINER_RESOURCE, layouts.CONTAINER_UUID),
        (cx.resource, str(cx.vf_group)),
        (KVM, "kvm0"), (KVM, "kvm1"),
    ])

    result = status(tree, view)

    assert result["resourceNames"] == sorted(
        [hgx.resource, mdev.small_resource, vgpu.resource, layouts.CONTAINER_RESOURCE])
    served = {(d["address"], d["resourceName"]): d["allocatable"] for d in result["devices"]}
    assert served == {
        (hgx.gpus[0], hgx.resource): 1, (hgx.gpus[1], hgx.resource): 1,
        (mdev.parent, mdev.small_resource): 3,
        (vgpu.pf, ""): 0, (vgpu.vfs[0], vgpu.resource): 1, (vgpu.vfs[1], ""): 0, (vgpu.vfs[2], ""): 0,
        (layouts.UNBOUND_GPU, ""): 0, (layouts.CONTAINER_GPU, ""): 0,
    }
    assert result["problems"] == []
