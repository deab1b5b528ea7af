"""The kinds cozygpu reads are indexed the way the binder and the webhooks look them up."""

from __future__ import annotations

from cozygpu import keys
from cozygpu.cache.frozen import freeze
from cozygpu.cache.store import Store
from cozygpu.views import specs
from tests.cache import shapes


def test_devices_are_found_by_node_by_attached_vmi_and_by_class() -> None:
    store = Store(specs.GPU_DEVICES.key, specs.GPU_DEVICES.all_indexers())
    bound = shapes.gpu_device("tenant-a", "d1") | shapes.gpu_device_status("node-1", vmi="vm1")
    pending = shapes.gpu_device("tenant-a", "d2", class_name="a100")
    for obj in (bound, pending):
        obj["metadata"]["resourceVersion"] = "1"
        store.upsert(freeze(obj))
    assert [d["metadata"]["name"] for d in store.by_index(specs.DEVICES_BY_NODE, "node-1")] == ["d1"]
    assert [d["metadata"]["name"] for d in store.by_index(specs.DEVICES_BY_VMI, "tenant-a/vm1")] == ["d1"]
    assert store.by_index(specs.DEVICES_BY_VMI, "tenant-b/vm1") == []
    assert [d["metadata"]["name"] for d in store.by_index(specs.DEVICES_BY_CLASS, "a100")] == ["d2"]
    assert sorted(store.index_values("namespace")) == ["tenant-a"]


def test_the_settings_informer_is_scoped_to_one_object_in_the_controller_namespace() -> None:
    spec = specs.settings_configmap("cozy-gpu")
    assert spec.path == "/api/v1/namespaces/cozy-gpu/configmaps"
    assert spec.selector_params() == {"fieldSelector": f"metadata.name={keys.SETTINGS_CONFIGMAP}"}
    assert spec.key == "settings"
    assert spec == specs.settings_configmap("cozy-gpu")


def test_kubevirt_kinds_wait_for_their_crds_and_built_in_kinds_do_not() -> None:
    assert specs.VMIS.needs_crd
    assert specs.KUBEVIRTS.needs_crd
    assert specs.GPU_DEVICES.needs_crd
    assert not specs.PODS.needs_crd
    assert not specs.TENANT_QUOTAS.needs_crd
    assert specs.PODS.key == "pods.v1"
    assert specs.VMIS.key == "virtualmachineinstances.v1.kubevirt.io"
