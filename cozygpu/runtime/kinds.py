"""The informers the controller process runs, defined once (R-RUN-2, R-RUN-3).

Every reader asks the cache for the same ``KindSpec`` objects from here (the
cache refuses a second, different spec under one key), so the binder, the
webhooks and the settings publisher share one informer per kind.

Which kinds run where:
- ``webhook_kinds`` start on every replica before the webhook server and gate
  readiness. With GPU enabled: GPUClass, GPUDevice, GPUNode, Nodes,
  Namespaces, ResourceQuotas, Pods and the settings ConfigMap (field-selected
  to that one object). Without GPU: GPUClass and GPUDevice, which the
  always-on reconcilers read.
- ``lazy_kinds`` (GPU enabled only): VMIs and KubeVirt CRs. They are added to
  the cache too, start whenever KubeVirt's CRDs are served, and are never
  waited for by readiness (other components wait for this controller's
  readiness and must not hang on KubeVirt).
"""

from __future__ import annotations

from typing import Final

from cozygpu import keys
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.transforms import slim_node, slim_pod

KUBEVIRT_GROUP: Final = "kubevirt.io"
KUBEVIRT_VERSION: Final = "v1"

GPU_CLASSES: Final = KindSpec(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL, keys.GPUCLASS_KIND, False)
GPU_DEVICES: Final = KindSpec(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, keys.GPUDEVICE_KIND, True)
GPU_NODES: Final = KindSpec(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL, keys.GPUNODE_KIND, False)
NODES: Final = KindSpec("", "v1", "nodes", "Node", False, transform=slim_node)
NAMESPACES: Final = KindSpec("", "v1", "namespaces", "Namespace", False)
RESOURCE_QUOTAS: Final = KindSpec("", "v1", "resourcequotas", "ResourceQuota", True)
PODS: Final = KindSpec("", "v1", "pods", "Pod", True, transform=slim_pod)
VMIS: Final = KindSpec(KUBEVIRT_GROUP, KUBEVIRT_VERSION, "virtualmachineinstances", "VirtualMachineInstance", True)
KUBEVIRTS: Final = KindSpec(KUBEVIRT_GROUP, KUBEVIRT_VERSION, "kubevirts", "KubeVirt", True)

_SETTINGS: dict[str, KindSpec] = {}


def settings_configmap(namespace: str) -> KindSpec:
    """The informer of the one settings ConfigMap in the controller namespace (the same object per namespace)."""
    spec = _SETTINGS.get(namespace)
    if spec is None:
        spec = KindSpec("", "v1", "configmaps", "ConfigMap", True, namespace=namespace,
                        field_selector=f"metadata.name={keys.SETTINGS_CONFIGMAP}", name="settings-configmap")
        _SETTINGS[namespace] = spec
    return spec


def webhook_kinds(*, enable_gpu: bool, namespace: str) -> tuple[KindSpec, ...]:
    """The kinds every replica warms before it serves, and readiness waits for."""
    if not enable_gpu:
        return (GPU_CLASSES, GPU_DEVICES)
    return (GPU_CLASSES, GPU_DEVICES, GPU_NODES, NODES, NAMESPACES, RESOURCE_QUOTAS, PODS,
            settings_configmap(namespace))


def lazy_kinds(*, enable_gpu: bool) -> tuple[KindSpec, ...]:
    """KubeVirt's kinds: cached once served, never waited for."""
    return (VMIS, KUBEVIRTS) if enable_gpu else ()
