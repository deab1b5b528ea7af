"""A simulated NVIDIA DRA driver for kwok nodes, at its API boundary only.

What a real cluster gets from NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu)
that the scheduler and controllers read: the DeviceClass ``vfio.gpu.nvidia.com``
and, per node, a ResourceSlice of the GPUs bound to vfio-pci. ``publish`` writes
those objects, so the real kube-scheduler allocates claims from them and the real
resourceclaim controller reserves and releases them, with no kubelet plugin.

Imitated, as read in the driver's chart (``templates/deviceclass-vfio-gpu.yaml``)
and kubelet plugin (``cmd/gpu-kubelet-plugin/deviceinfo.go``, ``nvlib.go``) and in
``k8s.io/dynamic-resource-allocation`` (``kubeletplugin``, ``resourceslice``):

- the DeviceClass selects ``device.driver == 'gpu.nvidia.com'`` **and**
  ``device.attributes['gpu.nvidia.com'].type == 'vfio'`` (the same driver
  publishes ``type: gpu`` devices for containers; only the vfio ones are for VMs);
- one slice per node: ``spec.driver: gpu.nvidia.com``, ``spec.nodeName``, a pool
  named after the node (``resourceSliceCount: 1``), owned by the Node (controller
  reference), so the garbage collector deletes it with the node, as the kubelet
  plugin's slices are;
- devices ``gpu-vfio-<index>`` with the attributes the driver sets: ``type``
  ``vfio``, ``uuid`` (a SHA-1 UUID of the PCI address; of node and address here), ``deviceID``,
  ``vendorID`` ``0x10de``, ``productName``, ``iommuFDEnabled``,
  ``resource.kubernetes.io/pciBusID``, ``resource.kubernetes.io/pcieRoot``,
  ``resource.kubernetes.io/numaNode`` (an int: ``DRAListTypeAttributes`` is off by
  default in 1.36), and the capacity ``addressableMemory``.

Not imitated: the kubelet side (NodePrepareResources, CDI specs, binding the
device to vfio-pci), the ``gpu`` and MIG devices and their shared counters,
health taints, and the slice's generated name (a fixed ``<node>-gpu.nvidia.com``
here, so publishing twice is a no-op). A slice whose node was replaced (another
uid) or whose devices differ is rewritten with the pool generation raised by one,
as the driver's slice controller does on a change.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from typing import Any

from cozygpu.devcluster import nodes
from cozygpu.kube import Client, errors, resource_path

API_GROUP, API_VERSION = "resource.k8s.io", "v1"
DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "vfio.gpu.nvidia.com"
DEVICE_CLASSES = resource_path(API_GROUP, API_VERSION, "deviceclasses")
RESOURCE_SLICES = resource_path(API_GROUP, API_VERSION, "resourceslices")
#: What the simulated boards are: an H100 SXM5 80 GB (PCI device 0x2330).
PRODUCT_NAME = "GH100 [H100 SXM5 80GB]"
PCI_DEVICE_ID = "0x2330"
NVIDIA_VENDOR_ID = "0x10de"
ADDRESSABLE_MEMORY = "80Gi"
#: GPUs per PCIe root complex and per NUMA node (two roots a socket, as on an 8-GPU HGX board).
GPUS_PER_ROOT = 2
ROOTS_PER_NUMA_NODE = 2


def device_name(index: int) -> str:
    """The name the driver gives the ``index``-th vfio GPU of a node (``VfioDeviceInfo.CanonicalName``)."""
    return f"gpu-vfio-{index}"


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def device_class() -> dict[str, Any]:
    selector = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'vfio'"
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": selector}}]},
    }


def device(node: str, index: int) -> dict[str, Any]:
    """One vfio GPU; its PCI address is made up but stable per node and index."""
    root = index // GPUS_PER_ROOT
    domain, root_bus = root // 16, 0x10 * (root % 16)
    bus_id = f"{domain:04x}:{root_bus + 8:02x}:{index % GPUS_PER_ROOT:02x}.0"
    return {
        "name": device_name(index),
        "attributes": {
            "type": {"string": "vfio"},
            "uuid": {"string": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/{bus_id}"))},
            "deviceID": {"string": PCI_DEVICE_ID},
            "vendorID": {"string": NVIDIA_VENDOR_ID},
            "productName": {"string": PRODUCT_NAME},
            "iommuFDEnabled": {"bool": True},
            "resource.kubernetes.io/pciBusID": {"string": bus_id},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci{domain:04x}:{root_bus:02x}"},
            "resource.kubernetes.io/numaNode": {"int": root // ROOTS_PER_NUMA_NODE},
        },
        "capacity": {"addressableMemory": {"value": ADDRESSABLE_MEMORY}},
    }


def resource_slice(node: str, node_uid: str, gpus: int, *, generation: int = 1) -> dict[str, Any]:
    """The slice the driver would publish for ``node`` with ``gpus`` vfio GPUs."""
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                 "controller": True}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [device(node, index) for index in range(gpus)],
        },
    }


async def ensure_device_class(client: Client) -> None:
    if await client.get_or_none(f"{DEVICE_CLASSES}/{DEVICE_CLASS}") is not None:
        return
    with contextlib.suppress(errors.AlreadyExists):  # another publisher made it in between
        await client.create(DEVICE_CLASSES, device_class())


async def publish_node(client: Client, node: str, gpus: int) -> dict[str, Any]:
    """Publish ``node``'s slice (the Node must exist: the slice is owned by it); returns the slice as stored."""
    node_uid: str = (await client.get(f"{nodes.NODES}/{node}"))["metadata"]["uid"]
    path = f"{RESOURCE_SLICES}/{slice_name(node)}"
    current = await client.get_or_none(path)
    if current is None:
        try:
            return await client.create(RESOURCE_SLICES, resource_slice(node, node_uid, gpus))
        except errors.AlreadyExists:
            current = await client.get(path)
    owners = [ref.get("uid") for ref in current["metadata"].get("ownerReferences") or []]
    wanted = resource_slice(node, node_uid, gpus, generation=current["spec"]["pool"]["generation"])
    if owners == [node_uid] and current["spec"]["devices"] == wanted["spec"]["devices"]:
        return current
    wanted["spec"]["pool"]["generation"] += 1
    wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    return await client.replace(path, wanted)


async def publish(client: Client, gpus_per_node: Mapping[str, int], *,
                  concurrency: int = nodes.CONCURRENCY) -> None:
    """The DeviceClass and one slice per node with that many vfio GPUs; publishing again changes nothing."""
    await ensure_device_class(client)
    await nodes._bounded((publish_node(client, node, gpus) for node, gpus in gpus_per_node.items()), concurrency)
