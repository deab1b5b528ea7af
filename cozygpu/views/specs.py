"""The kinds cozygpu reads, as ``KindSpec``s with their transforms and indexes.

One place decides what each informer holds, so the binder, the webhooks and the
controller process share informers instead of each watching on its own. The
process adds the specs it needs (``settings_configmap(namespace)`` needs its
namespace); readiness (R-RUN-2) is ``has_synced`` over the ones that need no
KubeVirt, and the KubeVirt kinds are CRD-backed, so they join when served
(R-RUN-3).

Index names are constants here so readers never spell them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from cozygpu import keys
from cozygpu.cache.decoders import decode_pod_page
from cozygpu.cache.frozen import FrozenDict
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.store import index_field
from cozygpu.cache.transforms import slim_node, slim_pod

#: GPUDevices by ``status.nodeName`` (the node holding their units).
DEVICES_BY_NODE: Final = "node"
#: GPUDevices by the VMI they are attached to: ``"<namespace>/<vmi name>"``.
DEVICES_BY_VMI: Final = "vmi"
#: GPUDevices by ``spec.className``.
DEVICES_BY_CLASS: Final = "class"
#: Pods by ``spec.nodeName``.
PODS_BY_NODE: Final = "node"
#: Pods by ``metadata.uid`` (VMI ``status.activePods`` names launchers by UID, R-MOD-5).
PODS_BY_UID: Final = "uid"
#: VMIs by ``status.nodeName``.
VMIS_BY_NODE: Final = "node"


def index_device_vmi(device: FrozenDict) -> Iterable[str]:
    """Files a GPUDevice under ``"<namespace>/<vmi>"`` while it is attached."""
    attachment = (device.get("status") or {}).get("attachment") or {}
    vmi = attachment.get("vmi") if isinstance(attachment, dict) else None
    namespace = (device.get("metadata") or {}).get("namespace")
    return (f"{namespace}/{vmi}",) if vmi and namespace else ()


GPU_CLASSES: Final = KindSpec(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL, keys.GPUCLASS_KIND, False)
GPU_DEVICES: Final = KindSpec(
    keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, keys.GPUDEVICE_KIND, True,
    indexers={
        DEVICES_BY_NODE: index_field("status", "nodeName"),
        DEVICES_BY_VMI: index_device_vmi,
        DEVICES_BY_CLASS: index_field("spec", "className"),
    },
)
GPU_NODES: Final = KindSpec(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL, keys.GPUNODE_KIND, False)

NODES: Final = KindSpec("", "v1", "nodes", "Node", False, transform=slim_node)
PODS: Final = KindSpec(
    "", "v1", "pods", "Pod", True, transform=slim_pod, page_decoder=decode_pod_page,
    indexers={PODS_BY_NODE: index_field("spec", "nodeName"), PODS_BY_UID: index_field("metadata", "uid")},
)
NAMESPACES: Final = KindSpec("", "v1", "namespaces", "Namespace", False)
#: Only the quota the tenant chart renders (R-MOD-2), in every namespace.
TENANT_QUOTAS: Final = KindSpec(
    "", "v1", "resourcequotas", "ResourceQuota", True,
    field_selector=f"metadata.name={keys.TENANT_QUOTA_NAME}", name="tenant-quotas",
)

VMIS: Final = KindSpec(
    "kubevirt.io", "v1", "virtualmachineinstances", "VirtualMachineInstance", True,
    indexers={VMIS_BY_NODE: index_field("status", "nodeName")},
)
VMS: Final = KindSpec("kubevirt.io", "v1", "virtualmachines", "VirtualMachine", True)
KUBEVIRTS: Final = KindSpec("kubevirt.io", "v1", "kubevirts", "KubeVirt", True)

#: DRA (``resource.k8s.io/v1``, GA since 1.34; SPEC §1.5): the drivers' published devices, the classes of
#: devices, and the claims that hold them (a hold's own, named after its GPUDevice, and everyone else's).
#: Built in, so served when API discovery lists them: absent on a plane without ``resource.k8s.io/v1``.
RESOURCE_SLICES: Final = KindSpec("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False)
DEVICE_CLASSES: Final = KindSpec("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False)
RESOURCE_CLAIMS: Final = KindSpec("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True)
#: An administrator's taints on devices (``resource.k8s.io/v1`` since 1.37; 1.36 served it only as beta, off).
DEVICE_TAINT_RULES: Final = KindSpec("resource.k8s.io", "v1", "devicetaintrules", "DeviceTaintRule", False)
#: The kinds a cluster without DRA (or KubeVirt) does not serve: a snapshot is built without them.
OPTIONAL_SNAPSHOT_SPECS: Final = (VMIS, KUBEVIRTS, RESOURCE_SLICES, DEVICE_CLASSES, RESOURCE_CLAIMS,
                                  DEVICE_TAINT_RULES)


def settings_configmap(namespace: str) -> KindSpec:
    """The settings ConfigMap informer: one namespace, one name, one object (R-RUN-2)."""
    return KindSpec(
        "", "v1", "configmaps", "ConfigMap", True, namespace=namespace,
        field_selector=f"metadata.name={keys.SETTINGS_CONFIGMAP}", name="settings",
    )

#: The kinds the model's snapshot is made of, by the names ``LiveSnapshot`` takes them under
#: (the binder's and the webhooks'); the KubeVirt and DRA ones may be not served.
SNAPSHOT_SPECS: Final[dict[str, KindSpec]] = {
    keys.GPUCLASS_KIND: GPU_CLASSES, keys.GPUDEVICE_KIND: GPU_DEVICES, keys.GPUNODE_KIND: GPU_NODES,
    "Node": NODES, "Pod": PODS, "VirtualMachineInstance": VMIS,
    "ResourceQuota": TENANT_QUOTAS, "Namespace": NAMESPACES, "KubeVirt": KUBEVIRTS,
    "ResourceSlice": RESOURCE_SLICES, "DeviceClass": DEVICE_CLASSES, "ResourceClaim": RESOURCE_CLAIMS,
    "DeviceTaintRule": DEVICE_TAINT_RULES,
}
