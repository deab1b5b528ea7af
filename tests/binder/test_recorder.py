"""Events go out off the placement path: a cycle's status writes never wait for them, and the queue is bounded."""

from __future__ import annotations

import asyncio
import collections
from typing import Any, cast

from cozygpu.binder.recorder import EventRecorder
from cozygpu.binder.status import DeviceWrite, EventNote, SetWrite
from cozygpu.binder.writes import write_sets
from cozygpu.kube import Client
from cozygpu.kube.client import Obj
from cozygpu.passes.writes import Writes
from tests.model.factories import NOW

NOTE = EventNote(type="Normal", reason="Bound", message="bound on node n1")


class SlowEvents:
    """An API that takes status patches at once and holds every Event create until ``events_open`` is set."""

    def __init__(self) -> None:
        self.patched: list[str] = []
        self.created: list[Obj] = []
        self.events_open = asyncio.Event()
        self.created_one = asyncio.Event()
        self.create_started = asyncio.Event()
        self._version = 100

    async def merge_patch(self, path: str, patch: Obj, *, resource_version: str | None = None, **_: Any) -> Obj:
        self._version += 1
        self.patched.append(path)
        return {"kind": "GPUDevice", "metadata": {"resourceVersion": str(self._version)}, **patch}

    async def create(self, path: str, body: Obj, **_: Any) -> Obj:
        self.create_started.set()
        await self.events_open.wait()
        self.created.append(body)
        self.created_one.set()
        return body


def device_write(name: str, notes: int = 1) -> DeviceWrite:
    return DeviceWrite(key=("tenant-a", name), uid=f"uid-{name}", resource_version="7",
                       status={"phase": "Bound", "nodeName": "n1"}, events=(NOTE,) * notes)


def recorder_on(api: SlowEvents, capacity: int = 16) -> tuple[EventRecorder, collections.Counter[str]]:
    dropped: collections.Counter[str] = collections.Counter()
    recorder = EventRecorder(cast(Client, api), instance="replica-0", capacity=capacity,
                             on_dropped=lambda reason, n: dropped.update({reason: n}))
    return recorder, dropped


async def test_a_cycles_status_writes_do_not_wait_for_their_events() -> None:
    api = SlowEvents()
    recorder, dropped = recorder_on(api)
    sets = [SetWrite(label=f"GPUDevice tenant-a/d{i}", devices=(device_write(f"d{i}"),)) for i in range(3)]
    async with asyncio.timeout(10):  # an Event create never returns until opened: a writer waiting for it hangs
        report = await write_sets(cast(Client, api), sets, Writes(),
                                  on_written=lambda write, version: recorder.record(write, version, now=NOW))
    assert len(report.written) == 3
    assert len(api.patched) == 3
    assert api.created == []
    assert len(recorder) == 3

    async with asyncio.TaskGroup() as tasks:
        sender = tasks.create_task(recorder.run())
        api.events_open.set()
        async with asyncio.timeout(10):
            while len(api.created) < 3:
                api.created_one.clear()
                await api.created_one.wait()
        sender.cancel()
    # Each Event names its device at the version its write got, in the order written.
    assert [(e["involvedObject"]["name"], e["involvedObject"]["resourceVersion"]) for e in api.created] == [
        ("d0", "101"), ("d1", "102"), ("d2", "103")]
    assert not dropped


def test_a_full_queue_drops_the_events_that_do_not_fit_and_counts_them() -> None:
    recorder, dropped = recorder_on(SlowEvents(), capacity=2)
    recorder.record(device_write("d0"), "8", now=NOW)
    recorder.record(device_write("d1", notes=2), "9", now=NOW)
    assert len(recorder) == 2
    assert dropped == {"full": 1}


async def test_events_still_queued_when_the_term_ends_are_counted_dropped() -> None:
    api = SlowEvents()
    recorder, dropped = recorder_on(api)
    recorder.record(device_write("d0", notes=3), "8", now=NOW)
    async with asyncio.TaskGroup() as tasks:
        sender = tasks.create_task(recorder.run())
        await api.create_started.wait()  # the sender took the first and waits on its create
        sender.cancel()
    assert api.created == []
    assert len(recorder) == 0
    assert dropped == {"term ended": 2}
