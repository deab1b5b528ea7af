"""Events that move nothing a decision reads start no full pass (the binder's trigger, on the real API server).

A Node heartbeat, a quota's usage, a pod that asks for no GPU and the
binder's own GPUNode and GPUClass reports used to wake the full lane every time; at
a fleet's size that is a pass over everything per heartbeat. The trigger the
driver waits on (``Cache.trigger(..., when=binder.worth_a_pass())``) is
checked directly: an informer fires it synchronously while it hands the
event out, so once the binder's cache has seen a write, whether it fired is
already decided.
"""

from __future__ import annotations

from typing import Any

from cozygpu import keys
from cozygpu.cache.triggers import Trigger
from cozygpu.kube import Client, resource_path
from cozygpu.views import specs
from tests.binder.support import class_path
from tests.binder.world import GPUNODES, NODES, RunningBinder, World, running_binder, seen_by, stamp


async def fired_by(running: RunningBinder, trigger: Trigger, spec_key: str, written: dict[str, Any]) -> bool:
    """Whether ``trigger`` fired for ``written`` (waited for until the binder's cache holds it)."""
    await seen_by(running, spec_key, written)
    return trigger.poll() is not None


async def test_heartbeats_quota_usage_gpu_less_pods_and_own_reports_start_no_full_pass(
        admin: Client, namespace: str) -> None:
    world = await World.make(admin, namespace)
    node = await world.node("n1", 2)
    quota_path = resource_path("", "v1", "resourcequotas", namespace=namespace)
    await admin.create(quota_path, {"metadata": {"name": keys.TENANT_QUOTA_NAME},
                                    "spec": {"hard": {"count/configmaps": "8"}}})
    pods = resource_path("", "v1", "pods", namespace=namespace)
    async with running_binder(admin) as running:
        trigger = running.cache.trigger(*running.binder.kinds, name="test", when=running.binder.worth_a_pass())
        try:
            trigger.poll()

            heartbeat = {"type": "Ready", "status": "True", "reason": "Test", "lastHeartbeatTime": stamp()}
            written = await admin.merge_patch(f"{NODES}/{node}/status", {"status": {"conditions": [heartbeat]}})
            assert not await fired_by(running, trigger, specs.NODES.key, written), "a kubelet heartbeat"

            written = await admin.merge_patch(f"{quota_path}/{keys.TENANT_QUOTA_NAME}/status", {"status": {
                "hard": {"count/configmaps": "8"}, "used": {"count/configmaps": "1"}}})
            assert not await fired_by(running, trigger, specs.TENANT_QUOTAS.key, written), "a quota's usage"

            written = await admin.create(pods, {"metadata": {"name": "web"}, "spec": {"containers": [
                {"name": "web", "image": "web", "resources": {"requests": {"cpu": "1"}}}]}})
            assert not await fired_by(running, trigger, specs.PODS.key, written), "a pod that uses no GPU"

            written = await admin.merge_patch(f"{GPUNODES}/{node}/status", {"status": {"conditions": [
                {"type": "Eligible", "status": "True", "reason": "Test", "message": "m",
                 "lastTransitionTime": stamp()}]}})
            assert not await fired_by(running, trigger, specs.GPU_NODES.key, written), "the binder's own report"

            written = await admin.merge_patch(f"{class_path(world.gpu_class)}/status", {"status": {
                "units": 2, "held": 0, "free": 2}})
            assert not await fired_by(running, trigger, specs.GPU_CLASSES.key, written), "the binder's class report"

            # What a decision reads does start one.
            written = await admin.merge_patch(f"{NODES}/{node}", {"metadata": {"labels": {"zone": "b"}}})
            assert await fired_by(running, trigger, specs.NODES.key, written), "a Node label"
            written = await admin.merge_patch(f"{quota_path}/{keys.TENANT_QUOTA_NAME}", {"spec": {"hard": {
                f"requests.{keys.QUOTA_TOTAL}": "2"}}})
            assert await fired_by(running, trigger, specs.TENANT_QUOTAS.key, written), "a budget"
            written = await admin.create(pods, {"metadata": {"name": "cuda"}, "spec": {"containers": [
                {"name": "cuda", "image": "cuda", "resources": {"limits": {world.resource: "1"}}}]}})
            assert await fired_by(running, trigger, specs.PODS.key, written), "a pod asking for a GPU"
            await world.report("n1", 1)
            reported = await admin.get(f"{GPUNODES}/{node}")
            assert await fired_by(running, trigger, specs.GPU_NODES.key, reported), "the agent's report"
            written = await admin.merge_patch(class_path(world.gpu_class), {"spec": {"onCordon": "Stay"}})
            assert await fired_by(running, trigger, specs.GPU_CLASSES.key, written), "what a class sells"
            for finalizers in (["example.com/keep"], None):
                written = await admin.merge_patch(class_path(world.gpu_class), {"metadata": {
                    "finalizers": finalizers}})
                assert await fired_by(running, trigger, specs.GPU_CLASSES.key, written), "a class's finalizers"
        finally:
            for spec in running.binder.kinds:
                running.cache.informer(spec).remove_trigger(trigger)
