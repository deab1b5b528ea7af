"""Whatever the server and the network do, the informer ends with exactly the server's objects.

A property test over random schedules of writes, deletes, cut connections,
expired resourceVersions (410), watches the server ends and bookmarks. After
each schedule the store equals the server, and the events handed to handlers,
replayed on an empty map, rebuild the same content: no lost object, no phantom,
no DELETED for an object never added.
"""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from cozygpu.cache.informer import Informer
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.metrics import CacheMetrics
from cozygpu.cache.reflector import Reflector, ReflectorSettings
from cozygpu.cache.store import Event
from tests.cache.fakes import FakeApi, FakeClock, until

SPEC = KindSpec("gpu.cozystack.io", "v1alpha1", "gpudevices", "GPUDevice", True)
PATH = SPEC.path
NAMES = [f"d{i}" for i in range(6)]

step = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(NAMES)),
    st.tuples(st.just("remove"), st.sampled_from(NAMES)),
    st.tuples(st.sampled_from(["cut", "expire", "compact", "end", "bookmark", "tick", "tick"]), st.just("")),
)


async def _play(schedule: list[tuple[str, str]], seed: int) -> None:
    api, clock = FakeApi(), FakeClock()
    informer = Informer(SPEC)
    replay: dict[tuple[str, str], str] = {}

    def check_and_replay(event: Event) -> None:
        meta = event.obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if event.type == "ADDED":
            assert key not in replay, f"ADDED twice: {key}"
            replay[key] = meta["resourceVersion"]
        elif event.type == "MODIFIED":
            assert key in replay, f"MODIFIED before ADDED: {key}"
            replay[key] = meta["resourceVersion"]
        else:
            assert key in replay, f"DELETED a phantom: {key}"
            del replay[key]

    informer.subscribe(check_and_replay)
    reflector = Reflector(api, SPEC, informer.begin_cycle(), clock=clock,
                          metrics=CacheMetrics(CollectorRegistry()),
                          settings=ReflectorSettings(page_size=2), rng=random.Random(seed))
    task = asyncio.create_task(reflector.run())
    try:
        for action, name in schedule:
            if action == "put":
                api.put(PATH, {"metadata": {"name": name, "namespace": "t"}, "spec": {"n": api.rv}})
            elif action == "remove" and ("t", name) in api.objects.get(PATH, {}):
                api.remove(PATH, "t", name)
            elif action == "cut":
                api.cut()
            elif action == "expire":
                api.expire_watches()
            elif action == "compact":
                api.compact(PATH)
            elif action == "end":
                api.end_watches()
            elif action == "bookmark":
                api.bookmark()
            elif action == "tick":
                clock.advance(60.0)  # past any backoff; short of the inactivity timeout
            for _ in range(3):
                await asyncio.sleep(0)

        def settled() -> bool:
            clock.advance(60.0)
            if not (informer.has_synced and api.open_watches):
                return False
            stored = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                      for o in informer.store.list()}
            return stored == api.state(PATH)

        await until(settled, turns=5000)
        assert replay == api.state(PATH)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@settings(max_examples=150, deadline=None)
@given(schedule=st.lists(step, max_size=40), seed=st.integers(0, 2**16))
def test_the_informer_ends_with_exactly_the_servers_objects(schedule: list[tuple[str, str]], seed: int) -> None:
    asyncio.run(_play(schedule, seed))
