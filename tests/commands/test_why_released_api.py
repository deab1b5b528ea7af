"""``cozygpu why`` of a device whose hold expired (R-LEDGER-2): it says the device was released and what to do,
with the binder's condition and Events, where it would otherwise say the device does not exist."""

from __future__ import annotations

from cozygpu.commands import common, why
from cozygpu.kube import Client
from tests.binder.world import World


async def test_why_explains_a_released_device_and_how_to_hold_gpus_again(admin: Client, namespace: str) -> None:
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 2)
        message = "released after 1h idle (class x's idleHoldLimit 1h): its 1 unit on node n1 are free"
        await world.order("gone", 1, status={
            "phase": "Released", "heldSince": "2026-12-01T00:00:00Z", "idleSeconds": 3600,
            "conditions": [{"type": "Bound", "status": "False", "reason": "IdleHoldExpired", "message": message,
                            "lastTransitionTime": "2026-12-01T01:00:00Z"}]})
        cluster = await common.read_cluster(admin)
        assert ("gone" not in {key[1] for key in cluster.snapshot.devices if key[0] == namespace}), \
            "a released device is out of every decision"
        report = await why.explain_device(admin, cluster, namespace, "gone")
        assert report is not None, "not 'does not exist'"
        assert (report["phase"], report["reason"], report["node"]) == ("Released", "HoldReleased", None)
        assert report["now"].startswith(f"GPUDevice {namespace}/gone was released after sitting idle past class "
                                        f"{world.gpu_class}'s idleHoldLimit")
        assert report["bound"]["reason"] == "IdleHoldExpired"
        assert report["wouldChangeIt"] == [f"order again: a new GPUDevice of class {world.gpu_class}, count 1"]
    finally:
        await world.cleanup()
