"""Which informers the controller process runs, and which of them gate readiness (R-RUN-2, R-RUN-3).

The specs themselves are defined once, in ``cozygpu.views.specs``, with their
indexes and transforms; every reader (the settings publisher now, the binder
and the webhooks later) asks the cache for those same objects, and the cache
refuses a second, different spec under one key.

- ``webhook_kinds`` start on every replica before the webhook server and gate
  readiness. With GPU enabled: GPUClass, GPUDevice, GPUNode, Nodes,
  Namespaces, the tenant quotas (only ResourceQuotas named ``tenant-quota``),
  Pods and the settings ConfigMap (field-selected to that one object).
  Without GPU: GPUClass and GPUDevice, which the always-on reconcilers read.
- ``lazy_kinds`` (GPU enabled only): VMIs and KubeVirt CRs, and DRA's
  ResourceSlices, DeviceClasses, ResourceClaims and DeviceTaintRules (v1
  since 1.37). They are added to the
  cache too, start whenever KubeVirt's CRDs are served (DRA's kinds: when API
  discovery lists ``resource.k8s.io/v1``), and are never waited for by
  readiness (other components wait for this controller's readiness and must
  not hang on KubeVirt or on a cluster without DRA). A webhook that reads one
  before it synced answers "not ready" for that call only.
"""

from __future__ import annotations

from cozygpu.cache.kinds import KindSpec
from cozygpu.views import specs


def webhook_kinds(*, enable_gpu: bool, namespace: str) -> tuple[KindSpec, ...]:
    """The kinds every replica warms before it serves, and readiness waits for."""
    if not enable_gpu:
        return (specs.GPU_CLASSES, specs.GPU_DEVICES)
    return (specs.GPU_CLASSES, specs.GPU_DEVICES, specs.GPU_NODES, specs.NODES, specs.NAMESPACES,
            specs.TENANT_QUOTAS, specs.PODS, specs.settings_configmap(namespace))


def lazy_kinds(*, enable_gpu: bool) -> tuple[KindSpec, ...]:
    """KubeVirt's and DRA's kinds: cached once served, never waited for."""
    return specs.OPTIONAL_SNAPSHOT_SPECS if enable_gpu else ()
