"""Events about GPUDevices, sent off the placement path.

Contract:
- ``record`` never waits: it queues the Events of one written device (a
  core/v1 Event each, naming the device at the resourceVersion its write got)
  and returns. A placement cycle's only writes on an order's path are its
  status patches; the Events follow from ``run``, a task of its own in the
  leader term, one at a time under the client's rate.
- The queue is bounded (``capacity``): under pressure (a burst of thousands
  of decisions, an API server slow to take Events) a new Event that does
  not fit is dropped and counted (``cozygpu_binder_events_dropped_total``,
  ``reason="full"``). So are those still queued when the term ends
  (``reason="term ended"``): the next leader does not send them again.
- Events are best effort, as kube's own recorders are: a failed create is
  logged and counted as dropped (``reason="refused"``), never retried, never
  a reason to fail a pass.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Final

from cozygpu import keys
from cozygpu.api.events import Event, Involved
from cozygpu.base.logging import get_logger
from cozygpu.binder.status import DeviceWrite, EventNote
from cozygpu.kube import Client, errors, resource_path
from cozygpu.model.snapshot import DeviceKey

log = get_logger(__name__)

COMPONENT: Final = "cozygpu-binder"

#: Events queued at most; more are dropped (and counted) until the queue drains.
DEFAULT_CAPACITY: Final = 1024


def device_event(key: DeviceKey, uid: str, resource_version: str, note: EventNote, *, now: datetime,
                 instance: str) -> Event:
    """A core/v1 Event about one GPUDevice, under a name of its own."""
    namespace, name = key
    return Event(name=f"{name[:200]}.{uuid.uuid4().hex[:16]}",
                 involved=Involved(api_version=keys.API_VERSION, kind=keys.GPUDEVICE_KIND, namespace=namespace,
                                   name=name, uid=uid, resource_version=resource_version),
                 type=note.type, reason=note.reason, message=note.message, component=COMPONENT, instance=instance,
                 time=now)


class EventRecorder:
    """A bounded queue of Events and the task that sends them (see the module docstring)."""

    def __init__(self, client: Client, *, instance: str, capacity: int = DEFAULT_CAPACITY,
                 on_dropped: Callable[[str, int], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"an event queue holds at least one Event, not {capacity}")
        self._client = client
        self._instance = instance
        self._capacity = capacity
        self._on_dropped = on_dropped
        self._queue: collections.deque[Event] = collections.deque()
        self._wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    def record(self, write: DeviceWrite, resource_version: str, *, now: datetime) -> None:
        """Queue the Events of ``write``, which the server took at ``resource_version``; never waits."""
        full = 0
        for note in write.events:
            if len(self._queue) >= self._capacity:
                full += 1
                continue
            self._queue.append(device_event(write.key, write.uid, resource_version, note, now=now,
                                            instance=self._instance))
        if full:
            log.warning("events dropped: the queue is full", device="/".join(write.key), dropped=full,
                        capacity=self._capacity)
            self._dropped("full", full)
        if self._queue:
            self._wake.set()

    async def flush(self) -> None:
        """Send every Event queued now, and any queued meanwhile."""
        while self._queue:
            event = self._queue.popleft()
            try:
                await self._client.create(resource_path("", "v1", "events", namespace=event.namespace),
                                          event.as_json())
            except (errors.KubeError, OSError) as error:
                log.warning("event not recorded", device=f"{event.namespace}/{event.involved.name}",
                            reason=event.reason, error=str(error))
                self._dropped("refused", 1)

    async def run(self) -> None:
        """Send Events as they are queued, until cancelled (the term's end); what is left then is dropped."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self.flush()
        finally:
            left = len(self._queue)
            self._queue.clear()
            if left:
                log.info("events not sent: the term ended", dropped=left)
                self._dropped("term ended", left)

    def _dropped(self, reason: str, count: int) -> None:
        if self._on_dropped is not None:
            self._on_dropped(reason, count)
