"""DRA units (and the ResourceSlice decoding they read): the devices of the current, complete pools that
the DeviceClass's and the offer's selectors match."""

from __future__ import annotations

import attrs

from cozygpu.devcluster import dra_driver
from cozygpu.model.dra import DeviceRef, SliceDevice, SliceView, current_slices, offer_units
from cozygpu.views.decode import resource_slice_view

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
