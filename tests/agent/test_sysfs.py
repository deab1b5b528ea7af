"""The sysfs reader on trees laid out as real nodes' are."""

from __future__ import annotations

import os

import pytest

from cozygpu.agent.sysfs import SysfsUnavailable, is_vfio_driver, read_sysfs
from cozygpu.devcluster import sysfs_tree as layouts
from cozygpu.devcluster.sysfs_tree import SysfsTree


def test_passthrough_h100s_are_gpus_but_their_audio_functions_nvswitch_and_bmc_vga_are_not(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)

    view = read_sysfs(tree.root)

    assert [fn.address for fn in view.gpus()] == list(hgx.gpus)
    first, second = (view.functions[address] for address in hgx.gpus)
    assert (first.vendor, first.device, first.class_text, first.driver) == ("10de", "2330", "0x030200", "vfio-pci")
    assert (first.iommu_group, first.numa_node) == (30, 0)
    assert (second.iommu_group, second.numa_node) == (120, 1)
    assert first.is_vfio_bound
    assert first.physfn is None
    assert first.mdev_types is None
    assert first.vgpu is None
    for other in (*hgx.audio, hgx.nvswitch, hgx.bmc_vga):
        assert not view.functions[other].is_gpu
    assert view.iommu_groups[30] == {hgx.gpus[0], hgx.audio[0]}
    assert view.problems == ()


def test_an_mdev_parent_reports_each_type_with_its_instances_and_every_mdev_its_parent_type_and_group(
    tree: SysfsTree,
) -> None:
    layout = layouts.mdev_parent(tree)

    view = read_sysfs(tree.root)

    parent = view.functions[layout.parent]
    assert parent.driver == "nvidia"
    assert parent.mdev_types is not None
    by_id = {t.id: t for t in parent.mdev_types}
    assert (by_id["nvidia-222"].name, by_id["nvidia-222"].available_instances, by_id["nvidia-222"].instances) == (
        "GRID T4-1Q", 9, 3)
    assert (by_id["nvidia-223"].name, by_id["nvidia-223"].instances) == ("GRID T4-2Q", 2)
    assert by_id["nvidia-230"].name == "nvidia-230"  # no name attribute: the type id stands in
    mdev = view.mdevs[layout.big[1]]
    assert (mdev.parent, mdev.type_id, mdev.iommu_group) == (layout.parent, layout.big_type, 205)
    assert view.iommu_groups[205] == {layout.big[1]}


def test_vgpu_vfs_report_their_pf_and_current_and_creatable_types(tree: SysfsTree) -> None:
    layout = layouts.vgpu_vfs(tree)

    view = read_sysfs(tree.root)

    pf = view.functions[layout.pf]
    assert pf.is_pf
    assert pf.vgpu is None
    assert not pf.is_active_vgpu_vf
    active, idle, unnamed = (view.functions[vf] for vf in layout.vfs)
    assert active.physfn == layout.pf
    assert not active.is_pf
    assert active.vgpu is not None
    assert active.vgpu.current_type == 1414
    assert active.vgpu.current_type_name == "NVIDIA L40S-24Q"
    assert [t.name for t in active.vgpu.creatable] == ["NVIDIA L40S-24Q", "NVIDIA L40S-48Q"]
    assert active.is_active_vgpu_vf
    assert idle.vgpu is not None
    assert idle.vgpu.current_type == 0
    assert not idle.is_active_vgpu_vf
    assert unnamed.vgpu is not None
    assert unnamed.vgpu.current_type_name is None
    assert unnamed.is_active_vgpu_vf


def test_an_unbound_gpu_has_no_driver(tree: SysfsTree) -> None:
    layouts.unbound_gpu(tree)

    fn = read_sysfs(tree.root).functions[layouts.UNBOUND_GPU]

    assert fn.is_gpu
    assert fn.driver == ""
    assert not fn.is_vfio_bound


def test_a_connectx_vf_on_vfio_is_read_but_is_no_gpu(tree: SysfsTree) -> None:
    layout = layouts.connectx_vf(tree)

    view = read_sysfs(tree.root)

    vf = view.functions[layout.vf]
    assert vf.iommu_group == layout.vf_group
    assert not vf.is_gpu
    assert vf.is_vfio_bound
    assert vf.physfn == layout.pf
    assert view.gpus() == []


@pytest.mark.parametrize(("driver", "vfio"), [
    ("vfio-pci", True), ("nvgrace_gpu_vfio_pci", True), ("nvgrace-gpu-vfio-pci", True), ("mlx5_vfio_pci", True),
    ("nvidia", False), ("vfio_mdev", False), ("", False),
])
def test_vfio_pci_and_its_variant_drivers_count_as_vfio(driver: str, vfio: bool) -> None:
    assert is_vfio_driver(driver) is vfio


def test_an_unreadable_attribute_is_reported_and_read_as_unknown(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    numa = tree.dir(hgx.gpus[0]) / "numa_node"
    numa.unlink()
    numa.mkdir()  # reading it fails as an unreadable file would (tests run as root: modes do not stop reads)

    view = read_sysfs(tree.root)

    assert view.functions[hgx.gpus[0]].numa_node == -1
    assert view.problems == (
        f"bus/pci/devices/{hgx.gpus[0]}/numa_node: unreadable (IsADirectoryError: Is a directory)",)


def test_garbage_in_the_class_file_skips_the_function_with_a_problem(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    (tree.dir(hgx.gpus[1]) / "class").write_text("not hex\n")

    view = read_sysfs(tree.root)

    assert [fn.address for fn in view.gpus()] == [hgx.gpus[0]]
    assert any("class: not a number" in p for p in view.problems)
    assert any(f"bus/pci/devices/{hgx.gpus[1]}: vendor or class unknown" in p for p in view.problems)


def test_dangling_device_and_mdev_links_are_reported_and_the_rest_is_read(tree: SysfsTree) -> None:
    layout = layouts.mdev_parent(tree)
    os.symlink("../../../devices/pci0000:99/0000:99:00.0/0000:99:00.1", tree.root / "bus/pci/devices/0000:99:00.1")
    os.symlink("../../../devices/gone", tree.root / "bus/mdev/devices/00000000-0000-0000-0000-000000000000")

    view = read_sysfs(tree.root)

    assert "bus/pci/devices/0000:99:00.1: dangling link" in view.problems
    assert "bus/mdev/devices/00000000-0000-0000-0000-000000000000: dangling link" in view.problems
    assert layout.parent in view.functions
    assert len(view.mdevs) == 5


def test_a_dangling_driver_link_still_names_the_driver(tree: SysfsTree) -> None:
    hgx = layouts.hgx_passthrough(tree)
    driver = tree.dir(hgx.gpus[0]) / "driver"
    driver.unlink()
    driver.symlink_to("../../../../bus/pci/drivers/vfio-pci-gone")

    assert read_sysfs(tree.root).functions[hgx.gpus[0]].driver == "vfio-pci-gone"


def test_a_root_without_pci_devices_is_unavailable_not_an_empty_node(tmp_path: os.PathLike[str]) -> None:
    with pytest.raises(SysfsUnavailable, match="cannot list PCI devices"):
        read_sysfs(tmp_path)
