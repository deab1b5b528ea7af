"""A follower's binder follows no event and keeps nothing; a term's start and end turn that on and off.

Every replica builds a binder, but only the leader's works subscribe to the
cache (``Binder.term``, the driver's scope). Before this, a follower's
placement work noted every bind request it saw and pruned them only in
leader passes, so its memory grew with the fleet's requests for as long as
it followed.
"""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import CollectorRegistry

from cozygpu.base.clock import LoopClock
from cozygpu.binder.binder import Binder, BinderConfig
from cozygpu.cache import Cache
from cozygpu.kube import Client
from cozygpu.views import specs
from tests.binder.support import device_path
from tests.binder.world import World


async def test_a_follower_notes_no_request_and_a_term_notes_them_only_while_it_lasts(
        admin: Client, namespace: str) -> None:
    world = await World.make(admin, namespace)
    await world.node("n1", 4)
    cache = Cache(admin, registry=CollectorRegistry())
    binder = Binder(cache, admin, BinderConfig(identity="follower", report_every=timedelta(0)), clock=LoopClock())
    asked: list[str] = []
    binder.on_request(lambda: asked.append("pass"))
    devices = cache.informer(specs.GPU_DEVICES)
    request = 0

    async def bind_request(name: str) -> None:
        nonlocal request
        request += 1
        written = await admin.merge_patch(device_path(namespace, name, status=True), {
            "status": {"bindRequest": {"id": f"r{request}", "vmi": "vm1"}}})
        await cache.wait_for_resource_version(specs.GPU_DEVICES.key, written["metadata"]["resourceVersion"],
                                              timeout=30)

    try:
        async with cache.running():
            await cache.wait_synced(specs.GPU_DEVICES, timeout=60)
            followed_by_others = devices.handler_count
            for name in ("a", "b"):
                await world.order(name, status=world.held("n1"))
            await bind_request("a")
            assert asked == [], "a follower asks for no pass"
            assert binder.placement.noted_requests == 0, "a follower keeps no request"
            assert devices.handler_count == followed_by_others

            with binder.term():
                assert devices.handler_count > followed_by_others
                await bind_request("b")
                assert asked, "the leader asks for a placement pass the moment it sees a request"
                assert binder.placement.noted_requests == 1
            assert binder.placement.noted_requests == 0, "the term's end keeps nothing"
            assert devices.handler_count == followed_by_others, "nor follows anything"
            asked.clear()
            await bind_request("a")
            assert asked == []
            assert binder.placement.noted_requests == 0
    finally:
        await world.cleanup()
