"""Every simulated node's agent report, written at the real agent's cadence, for benches on a full plane.

A node agent with nothing new to say rewrites its GPUNode report once per
``--report-interval`` (``cozygpu agent``'s default: 2 minutes), so a fleet of
N nodes sends N / interval writes a second, each at its own moment: about 42/s
at 5,000 nodes. ``AgentCadence.run()`` sends that stream: one report at a
time, spaced ``interval / len(nodes())`` apart (the node list is read again
before each write, so a fleet that grows is covered at once at its new rate),
each through the agent's own writer (``GPUNodeWriter``: a merge patch of
``status`` with the devices, resource names and a fresh ``agent.lastReport``).
A write is never awaited before the next is due: each runs as a task of its
own, at most ``in_flight`` at a time. A loop that falls more than a second
behind (a stall of this process) does not make the gap up in a burst: the
achieved rate says so instead. ``written`` counts the writes the server took;
``rate(mark)`` is the write rate since a ``mark()``.

Contract: ``run()`` lives in its caller's task group until cancelled, and
cancels its writes in flight when it is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from cozygpu.agent import command
from cozygpu.agent.report import GPUNodeWriter
from cozygpu.kube import Client, errors


def report_interval() -> float:
    """The agent's ``--report-interval`` default, in seconds, read from its flags as the agent reads them."""
    return command.parse(["--node", "-"], env={}).report_interval


class AgentCadence:
    """The reports of ``nodes()``, each rewritten every ``interval`` seconds, spread evenly."""

    def __init__(self, client: Client, nodes: Callable[[], Sequence[str]], body: Callable[[], dict[str, Any]], *,
                 interval: float | None = None, in_flight: int = 64) -> None:
        self.client, self.nodes, self.body = client, nodes, body
        self.interval = report_interval() if interval is None else interval
        self.in_flight = asyncio.Semaphore(in_flight)
        self.written = 0
        self.failed = 0
        self._writers: dict[str, GPUNodeWriter] = {}

    def target(self) -> float:
        """The rate the real agents would write at: writes/s."""
        return len(self.nodes()) / self.interval

    def mark(self) -> tuple[float, int]:
        return time.monotonic(), self.written

    def rate(self, mark: tuple[float, int]) -> float:
        """Writes/s the server took since ``mark``."""
        since, written = mark
        return (self.written - written) / max(1e-9, time.monotonic() - since)

    async def run(self) -> None:
        writes: set[asyncio.Task[None]] = set()
        cursor, due = 0, time.monotonic()
        try:
            while True:
                names = self.nodes()
                if not names:
                    await asyncio.sleep(1.0)
                    due = time.monotonic()
                    continue
                due += self.interval / len(names)
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
                elif now - due > 1.0:
                    due = now  # a stall is not made up in a burst
                await self.in_flight.acquire()
                name = names[cursor % len(names)]
                cursor += 1
                task = asyncio.create_task(self._write(name))
                writes.add(task)
                task.add_done_callback(writes.discard)
        finally:
            for task in writes:
                task.cancel()

    async def _write(self, name: str) -> None:
        try:
            writer = self._writers.get(name) or self._writers.setdefault(name, GPUNodeWriter(self.client, name))
            await writer.write(self.body())
            self.written += 1
        except errors.KubeError:
            self.failed += 1
        finally:
            self.in_flight.release()
