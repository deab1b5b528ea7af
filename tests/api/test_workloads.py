"""Usage records through the floor: built from a device, compared with what is stored."""

from __future__ import annotations

from typing import Any

from cozygpu import keys
from cozygpu.api import workloads


def gpu_device(phase: str = "Bound") -> dict[str, Any]:
    return {"metadata": {"name": "d1", "namespace": "t", "uid": "uid-d1"}, "spec": {"className": "h100", "count": 2},
            "status": {"phase": phase}}


def stored(body: dict[str, Any], **extra_labels: str) -> dict[str, Any]:
    meta = body["metadata"]
    return {**body, "metadata": {**meta, "resourceVersion": "5", "labels": {**meta["labels"], **extra_labels}}}


def test_a_record_without_a_resource_name_is_accounted_under_the_class_key() -> None:
    body = workloads.workload_body(gpu_device(), {})
    assert body["status"]["resources"] == {keys.class_quota_key("h100"): "2"}
    assert workloads.monitor_of(body) == workloads.MONITOR_NAME
    assert workloads.monitor_of({"metadata": {"labels": {"other": "x"}}}) == ""


def test_a_stored_record_says_what_is_wanted_whatever_labels_others_added() -> None:
    wanted = workloads.workload_body(gpu_device(), {"h100": "nvidia.com/x"})
    assert workloads.says(stored(wanted, team="a"), wanted)
    assert not workloads.says(None, wanted)
    assert not workloads.says(stored(workloads.workload_body(gpu_device("Lost"), {"h100": "nvidia.com/x"})), wanted)
    no_owner = stored(wanted)
    no_owner["metadata"] = {k: v for k, v in no_owner["metadata"].items() if k != "ownerReferences"}
    assert not workloads.says(no_owner, wanted)
    monitor = workloads.monitor_body("t")
    assert workloads.says(stored(monitor), monitor)


def test_a_replace_carries_the_version_read() -> None:
    wanted = workloads.monitor_body("t")
    assert workloads.with_version(wanted, None) is wanted
    assert workloads.with_version(wanted, stored(wanted))["metadata"]["resourceVersion"] == "5"
    assert workloads.with_version(wanted, stored(wanted))["metadata"]["name"] == workloads.MONITOR_NAME
