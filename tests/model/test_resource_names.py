from __future__ import annotations

from cozygpu.model.refusals import Reason
from cozygpu.model.resource_names import class_permission_problem, effective_names, permitted_gpu_names
from cozygpu.model.snapshot import MediatedDevice, NodeInventory, PciHostDevice, PermittedHostDevices
from tests.model.factories import gpu_class

TABLE = PermittedHostDevices(
    pci=(
        PciHostDevice(selector="10DE:2330", resource_name="nvidia.com/GH100_H100_SXM5_80GB"),
        PciHostDevice(selector="10de:26b9", resource_name="nvidia.com/AD102GL_L40S"),
        PciHostDevice(selector="15B3:101E", resource_name="mellanox.com/cx7_vf"),
    ),
    mediated=(MediatedDevice(selector="NVIDIA A10-24Q", resource_name="nvidia.com/A10-24Q"),),
)


def test_effective_names_join_the_hoster_list_classes_gpunodes_and_the_permitted_table() -> None:
    names = effective_names(
        hoster=["example.com/hoster-gpu"],
        classes=[gpu_class("t4", resource="nvidia.com/TU104GL_TESLA_T4")],
        inventories=[NodeInventory(name="n1", resource_names=frozenset({"nvidia.com/gpu"}))],
        permitted=TABLE,
    )
    assert names == {
        "example.com/hoster-gpu",
        "nvidia.com/TU104GL_TESLA_T4",
        "nvidia.com/gpu",
        "nvidia.com/GH100_H100_SXM5_80GB",
        "nvidia.com/AD102GL_L40S",
        "nvidia.com/A10-24Q",
    }


def test_a_connectx_vf_in_the_permitted_table_is_not_a_gpu_name() -> None:
    assert "mellanox.com/cx7_vf" not in permitted_gpu_names(TABLE)


def test_names_in_our_own_domain_are_never_resource_names() -> None:
    assert effective_names(hoster=["gpu.cozystack.io/h100"]) == frozenset()


def test_a_class_is_checked_against_every_pci_and_mediated_entry() -> None:
    assert class_permission_problem(gpu_class("vf", resource="mellanox.com/cx7_vf"), TABLE) is None
    assert class_permission_problem(gpu_class("a10", resource="nvidia.com/A10-24Q"), TABLE) is None
    problem = class_permission_problem(gpu_class("h200", resource="nvidia.com/GH100_H200_SXM_141GB"), TABLE)
    assert problem is not None
    assert problem.reason is Reason.CLASS_NOT_PERMITTED


def test_without_a_permitted_table_no_class_is_refused_for_it() -> None:
    assert class_permission_problem(gpu_class("h200", resource="nvidia.com/anything"), None) is None
    assert class_permission_problem(gpu_class("h200"), PermittedHostDevices()) is not None
