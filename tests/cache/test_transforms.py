"""Transforms keep what the model reads and drop the rest."""

from __future__ import annotations

import copy
import json
from typing import Any

from cozygpu import keys
from cozygpu.cache.transforms import LAST_APPLIED, slim_crd, slim_node, slim_pod, strip_metadata
from tests.cache import shapes


def _with_noise(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    meta["managedFields"] = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    meta.setdefault("annotations", {})[LAST_APPLIED] = json.dumps(obj)
    meta["uid"] = "0a1b2c3d"
    meta["resourceVersion"] = "42"
    return obj


def test_stripping_metadata_drops_managed_fields_and_the_last_applied_annotation() -> None:
    obj = {"metadata": {"name": "x", "managedFields": [{}], "annotations": {LAST_APPLIED: "{}", "keep": "me"}}}
    assert strip_metadata(obj) == {"metadata": {"name": "x", "annotations": {"keep": "me"}}}
    only_last_applied = {"metadata": {"name": "y", "annotations": {LAST_APPLIED: "{}"}}}
    assert strip_metadata(only_last_applied) == {"metadata": {"name": "y"}}
    assert strip_metadata({"spec": {}}) == {"spec": {}}


def test_a_slim_pod_keeps_identity_owners_node_phase_and_container_resources() -> None:
    pod = _with_noise(shapes.launcher_pod("tenant-a", "vm1", node="node-1", vmi_uid="vmi-uid"))
    pod.update(shapes.launcher_pod_status(pod))
    pod["spec"]["overhead"] = {"memory": "200Mi"}
    pod["spec"]["initContainers"][1]["restartPolicy"] = "Always"
    slim = slim_pod(copy.deepcopy(pod))

    meta = slim["metadata"]
    assert meta["name"] == pod["metadata"]["name"]
    assert (meta["namespace"], meta["uid"], meta["resourceVersion"]) == ("tenant-a", "0a1b2c3d", "42")
    assert meta["labels"] == pod["metadata"]["labels"]
    assert meta["ownerReferences"] == pod["metadata"]["ownerReferences"]
    assert "managedFields" not in meta
    assert LAST_APPLIED not in meta.get("annotations", {})
    assert slim["spec"]["nodeName"] == "node-1"
    assert slim["spec"]["overhead"] == {"memory": "200Mi"}
    assert slim["spec"]["containers"] == [{"name": "compute", "resources": pod["spec"]["containers"][0]["resources"]}]
    assert slim["spec"]["initContainers"][1] == {"name": "volumecontainerdisk-init", "resources":
                                                 pod["spec"]["initContainers"][1]["resources"],
                                                 "restartPolicy": "Always"}
    assert slim["status"] == {"phase": "Running"}


def test_a_slim_pod_is_a_small_fraction_of_a_launcher_pod() -> None:
    pod = _with_noise(shapes.launcher_pod("tenant-a", "vm1", node="node-1"))
    pod.update(shapes.launcher_pod_status(pod))
    full = len(json.dumps(pod))
    slim = len(json.dumps(slim_pod(copy.deepcopy(pod))))
    assert slim < full / 3, (slim, full)


def test_a_slim_node_drops_images_and_keeps_scheduling_fields() -> None:
    node = _with_noise(shapes.node("node-1"))
    node["spec"]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    slim = slim_node(copy.deepcopy(node))
    assert "images" not in slim["status"]
    assert slim["status"]["allocatable"] == node["status"]["allocatable"]
    assert slim["status"]["conditions"] == node["status"]["conditions"]
    assert slim["spec"]["taints"] == node["spec"]["taints"]
    assert slim["metadata"]["labels"] == node["metadata"]["labels"]


def test_a_slim_crd_keeps_only_what_served_kind_discovery_reads() -> None:
    crd = {
        "metadata": {"name": "things.example.io", "managedFields": [{}], "resourceVersion": "7"},
        "spec": {"group": "example.io", "scope": "Namespaced", "names": {"plural": "things", "kind": "Thing",
                                                                      "listKind": "ThingList"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object"}}}]},
        "status": {"conditions": [{"type": "Established", "status": "True"}], "acceptedNames": {}},
    }
    assert slim_crd(crd) == {
        "metadata": {"name": "things.example.io", "resourceVersion": "7"},
        "spec": {"group": "example.io", "scope": "Namespaced", "names": {"plural": "things", "kind": "Thing"},
                 "versions": [{"name": "v1", "served": True}]},
        "status": {"conditions": [{"type": "Established", "status": "True"}]},
    }

def test_a_slim_pod_keeps_only_cozygpu_annotations() -> None:
    pod = shapes.launcher_pod("tenant-a", "vm1", node="node-1")
    slim = slim_pod(copy.deepcopy(pod))
    assert slim["metadata"]["annotations"] == {keys.DEVICE_REFS_ANNOTATION: '[{"device":"vm1-gpu"}]'}
    del pod["metadata"]["annotations"][keys.DEVICE_REFS_ANNOTATION]
    assert "annotations" not in slim_pod(pod)["metadata"]
