"""Every label, annotation, finalizer, quota key and object name, defined once (SPEC §1.4).

The binder, the webhooks, the chart, the policies and the agent must agree on
these strings; nothing else in the package spells them out.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "gpu.cozystack.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# Kinds and their plural resource names.
GPUCLASS_KIND: Final = "GPUClass"
GPUCLASS_PLURAL: Final = "gpuclasses"
GPUDEVICE_KIND: Final = "GPUDevice"
GPUDEVICE_PLURAL: Final = "gpudevices"
GPUNODE_KIND: Final = "GPUNode"
GPUNODE_PLURAL: Final = "gpunodes"

#: Label on a VMI (copied to its launcher pods): this VMI names GPU devices.
DEVICE_REFS_LABEL: Final = f"{GROUP}/device-refs"
#: Annotation on a VMI: JSON list of ``{"device": N}`` / ``{"template": N, "class": C, "count": K}``.
DEVICE_REFS_ANNOTATION: Final = f"{GROUP}/device-refs"
#: Label on a GPUDevice created from a template reference; deleted with its VMI.
TEMPLATE_DEVICE_LABEL: Final = f"{GROUP}/template-device"
#: Finalizer keeping a released device, its binding and usage record until no VMI uses it.
DEVICE_FINALIZER: Final = f"{GROUP}/device-protection"
#: Finalizer the controller sets on every class; freezes what the class sells.
CLASS_FINALIZER: Final = f"{GROUP}/class-protection"
#: Reserved label key: the GPU WorkloadMonitor's selector. No tenant object may carry it.
USAGE_MONITOR_LABEL: Final = f"{GROUP}/usage-monitor"
#: Label on a tenant Namespace: the tenant and its subtree may order VGPU classes.
VGPU_ENTITLED_LABEL: Final = f"{GROUP}/vgpu-entitled"
#: On a tenant namespace, ``Never``: the binder never moves its stopped holds to make room for others' orders.
COMPACTION_LABEL: Final = f"{GROUP}/compaction"
VGPU_ENTITLED_VALUE: Final = "true"

#: Quota key prefix of GPU budgets: ``gpu.cozystack.io/<class>`` and ``gpu.cozystack.io/total``.
QUOTA_PREFIX: Final = f"{GROUP}/"
QUOTA_TOTAL: Final = f"{GROUP}/total"
#: The ResourceQuota the tenant chart renders from a tenant's resourceQuotas.
TENANT_QUOTA_NAME: Final = "tenant-quota"


def class_quota_key(class_name: str) -> str:
    """The budget key of one class (class names are DNS labels other than ``total``)."""
    return f"{QUOTA_PREFIX}{class_name}"


#: The settings ConfigMap in the controller namespace; parameter of the admission policies.
SETTINGS_CONFIGMAP: Final = "cozygpu-settings"
SETTINGS_RESOURCE_NAMES: Final = "resourceNames"
SETTINGS_RAW_NAMES: Final = "rawNames"
SETTINGS_GPU_ENABLED: Final = "gpuEnabled"
#: The DeviceClasses GPUClasses sell (``source.dra``), a sorted JSON list: the raw-claims policy reads it.
SETTINGS_DEVICE_CLASS_NAMES: Final = "deviceClassNames"
RAW_NAMES_ALLOW: Final = "allow"
RAW_NAMES_FORBID: Final = "forbid"

#: The Lease of leader election, in the controller namespace.
LEADER_LEASE: Final = "cozygpu-leader"

# Keys owned by others that cozygpu reads or writes.
MANAGED_BY_COZYSTACK_LABEL: Final = "internal.cozystack.io/managed-by-cozystack"
TENANT_NAMESPACE_LABEL: Final = "namespace.cozystack.io/host"
KUBEVIRT_LAUNCHER_LABEL: Final = "kubevirt.io"
KUBEVIRT_LAUNCHER_VALUE: Final = "virt-launcher"
#: The token extra naming the node a pod-bound service-account token was issued for.
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
