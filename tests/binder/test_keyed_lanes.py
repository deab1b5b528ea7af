"""On the driver, a keyed work's key whose time comes asks for that work's lane (no API server: nothing runs).

A key comes due with no event of its own: a refused write's backoff over, a
hold's idle deadline, an attachment's grace, a report held back by
``report_every``. Without the driver asking for the lane then, the key would
wait for an unrelated event or the five-minute resync.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from cozygpu.base.clock import FakeClock
from cozygpu.binder.binder import Binder, BinderConfig
from cozygpu.binder.loop import binder_driver
from cozygpu.cache.cache import Cache
from cozygpu.kube import Client


def test_each_keyed_works_key_whose_time_comes_asks_for_its_lane() -> None:
    clock = FakeClock()
    client = Client("https://127.0.0.1:9", ssl_context=None)
    cache = Cache(client, registry=CollectorRegistry(), clock=clock)
    binder = Binder(cache, client, BinderConfig(identity="t"), clock=clock)
    driver = binder_driver(binder, cache, registry=CollectorRegistry(), clock=clock)
    queues = binder.queues()
    assert {lane.value for lane in queues} == {"claims", "attachments", "ledger", "finalizers", "usage", "reports"}
    for lane, queue in queues.items():
        assert not driver.pending(lane)
        queue.add_after(("tenant-a", "d"), 2.0)
        clock.advance(1.0)
        assert not driver.pending(lane), lane.value
        clock.advance(1.0)
        assert driver.pending(lane), f"{lane.value}: its key came due and its lane was not asked for"
