"""Which usage records the holds call for (pure, R-BIND-9)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.api.workloads import MONITOR_NAME, WORKLOAD_MONITOR_LABEL, monitor_body, workload_body, workload_name
from cozygpu.base.clock import FakeClock
from cozygpu.binder.binder import Binder, BinderConfig
from cozygpu.binder.usage import usage_plan
from cozygpu.cache.cache import Cache
from cozygpu.cache.frozen import freeze
from cozygpu.cache.store import Event
from cozygpu.kube import Client
from cozygpu.views import specs

H100 = "nvidia.com/GH100_H100_SXM5_80GB"
CLASSES = [{"metadata": {"name": "h100"}, "spec": {"resourceName": H100}}]


def gpu_device(name: str, *, namespace: str = "t", phase: str | None = "Bound", count: int = 2) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"className": "h100", "count": count}, "status": {"phase": phase} if phase else {}}


def stored(body: dict[str, Any], rv: str = "3") -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "resourceVersion": rv}}


def test_a_held_device_gets_a_record_of_its_units_under_the_namespace_monitor() -> None:
    plan = usage_plan([gpu_device("d1")], CLASSES, [], [])
    (monitor,) = plan.put_monitors
    (record,) = plan.put_workloads
    assert monitor["spec"]["selector"] == {keys.USAGE_MONITOR_LABEL: "gpu"}
    assert monitor["metadata"]["labels"] == {keys.MANAGED_BY_COZYSTACK_LABEL: "true"}
    assert record["metadata"]["name"] == "gpudevice-d1"
    assert record["metadata"]["labels"][WORKLOAD_MONITOR_LABEL] == MONITOR_NAME
    assert keys.USAGE_MONITOR_LABEL not in record["metadata"]["labels"]
    assert record["status"] == {"kind": "GPUDevice", "type": "h100", "resources": {H100: "2"}, "operational": True}
    assert record["metadata"]["ownerReferences"][0]["uid"] == "uid-d1"


def test_a_lost_device_still_has_a_record_but_not_operational_and_a_pending_order_has_none() -> None:
    plan = usage_plan([gpu_device("lost", phase="Lost"), gpu_device("new", phase=None)], CLASSES, [], [])
    assert [(w["metadata"]["name"], w["status"]["operational"]) for w in plan.put_workloads] == [
        ("gpudevice-lost", False)]


def test_records_already_written_are_not_written_again() -> None:
    device = gpu_device("d1")
    plan = usage_plan([device], CLASSES, [stored(monitor_body("t"))], [stored(workload_body(device, {"h100": H100}))])
    assert plan.empty


def test_a_changed_record_is_replaced_on_the_version_read() -> None:
    device = gpu_device("d1")
    old = stored(workload_body(gpu_device("d1", phase="Lost"), {"h100": H100}), rv="11")
    plan = usage_plan([device], CLASSES, [stored(monitor_body("t"))], [old])
    (record,) = plan.put_workloads
    assert record["metadata"]["resourceVersion"] == "11"
    assert record["status"]["operational"] is True


def test_records_and_the_monitor_go_when_nothing_is_held_and_others_records_stay() -> None:
    mine = stored(workload_body(gpu_device("d1"), {}))
    theirs = {"metadata": {"name": "pod-x", "namespace": "t", "labels": {WORKLOAD_MONITOR_LABEL: "vm"}}}
    plan = usage_plan([], CLASSES, [stored(monitor_body("t")), {"metadata": {"name": "vm", "namespace": "t"}}],
                      [mine, theirs])
    assert [r.path.rsplit("/", 1)[1] for r in plan.remove_workloads] == ["gpudevice-d1"]
    assert [r.path.rsplit("/", 1)[1] for r in plan.remove_monitors] == [MONITOR_NAME]
    assert plan.remove_workloads[0].resource_version == "3"


def test_a_record_name_stays_a_valid_subdomain_for_the_longest_device_name() -> None:
    name = workload_name("a" * 253)
    assert len(name) == 253
    assert name != workload_name("a" * 252 + "b")


def test_a_class_event_asks_for_its_namespaces_only_when_its_resource_name_moved() -> None:
    """The binder's own class report comes back on every order: walking the class's devices then would
    cost a pass over the fleet's holds per answer, for records that read nothing of the status."""
    clock = FakeClock()
    client = Client("https://127.0.0.1:9", ssl_context=None)
    cache = Cache(client, registry=CollectorRegistry(), clock=clock)
    binder = Binder(cache, client, BinderConfig(identity="t"), clock=clock)
    feed = cache.informer(specs.GPU_DEVICES).begin_cycle()
    feed.replace([feed.prepare(stored(gpu_device(f"d{n}", namespace=f"t{n % 2}"))) for n in range(4)], "5")
    queue = binder.usage.queue
    old = freeze(stored(CLASSES[0]))
    reported = freeze({**stored(CLASSES[0], "6"), "status": {"available": 3}})
    binder.usage.class_changed(Event(specs.GPU_CLASSES.key, "MODIFIED", reported, old))
    assert not queue.ready(), "a status-only class change asked for usage records"
    renamed = freeze({**stored(CLASSES[0], "7"), "spec": {"resourceName": "nvidia.com/OTHER"}})
    binder.usage.class_changed(Event(specs.GPU_CLASSES.key, "MODIFIED", renamed, reported))
    assert queue.take() == ["t0", "t1"]
    binder.usage.class_changed(Event(specs.GPU_CLASSES.key, "ADDED", renamed))
    assert queue.take() == ["t0", "t1"]
