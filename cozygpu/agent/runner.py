"""The agent's loop: read sysfs and kubelet, judge the pods, write the GPUNode.

One cycle:
1. read sysfs (in a worker thread) and kubelet's pod-resources, together;
2. look up, through the API, the pods kubelet lists with GPU devices;
3. build the inventory and write it, when it differs from what this process
   last wrote, or when ``report_interval`` has passed since (the report time is
   how readers tell a live agent from a stale report: a stale report is
   unknown, never free).

When kubelet or sysfs cannot be read at all, the last complete report stays
as it is: the agent patches only ``status.agent.problems`` with the reason and
leaves devices, resource names and ``lastReport`` alone, then retries with
backoff (1 s doubling up to the interval, no jitter). Writing devices with nothing
allocatable instead would read as a node that lost its GPUs and move held
devices away. A failed write is retried the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from cozygpu import __version__
from cozygpu.agent.inventory import PodKey, PodState, build_inventory, pods_to_look_up
from cozygpu.agent.kubelet import KubeletUnavailable, KubeletView, read_kubelet
from cozygpu.agent.report import StatusWriter
from cozygpu.agent.sysfs import SysfsUnavailable, SysfsView, read_sysfs
from cozygpu.api.times import rfc3339
from cozygpu.base.backoff import Backoff
from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.deadline import deadline
from cozygpu.base.logging import get_logger
from cozygpu.kube import errors as kube_errors

_log = get_logger(__name__)

#: A GPUNode is one object in etcd: a broken node must not fill it with problems.
MAX_PROBLEMS: Final = 50

PodLookup = Callable[[Sequence[PodKey]], Awaitable[dict[PodKey, PodState]]]


def cap_problems(problems: Sequence[str], limit: int = MAX_PROBLEMS) -> list[str]:
    unique = list(dict.fromkeys(problems))
    if len(unique) <= limit:
        return unique
    return [*unique[: limit - 1], f"... and {len(unique) - limit + 1} more"]


@attrs.frozen
class Observation:
    """What one read found: a complete report, or only why there is none."""

    complete: bool
    #: For a complete one: ``devices`` and ``resourceNames``. Empty otherwise (the last report is kept).
    inventory: dict[str, Any]
    problems: tuple[str, ...]

    def status(self, *, version: str, report_time: str | None) -> dict[str, Any]:
        """The status fields to write; ``report_time`` goes in only with a complete report."""
        agent: dict[str, Any] = {"version": version, "problems": cap_problems(self.problems)}
        if self.complete and report_time is not None:
            agent["lastReport"] = report_time
        return {**self.inventory, "agent": agent}


class Agent:
    def __init__(
        self,
        *,
        sysfs_root: str | Path,
        socket_path: str,
        writer: StatusWriter,
        pod_lookup: PodLookup,
        interval: float = 15.0,
        report_interval: float = 120.0,
        kubelet_timeout: float = 10.0,
        version: str = __version__,
        clock: Clock | None = None,
    ) -> None:
        self.sysfs_root = sysfs_root
        self.socket_path = socket_path
        self.writer = writer
        self.pod_lookup = pod_lookup
        self.interval = interval
        self.report_interval = report_interval
        self.kubelet_timeout = kubelet_timeout
        self.version = version
        self._clock: Clock = clock if clock is not None else LoopClock()
        # Retries after a failed read or write; a success resets it, so no quiet-period reset.
        self._backoff = Backoff(self._clock, initial=1.0, cap=max(1.0, interval), jitter=0.0, reset_after=math.inf)
        self._written: Observation | None = None
        self._written_at: float | None = None

    # -- reading -------------------------------------------------------------------------

    async def _sysfs(self) -> SysfsView | str:
        try:
            return await asyncio.to_thread(read_sysfs, self.sysfs_root)
        except SysfsUnavailable as err:
            return str(err)

    async def _kubelet(self) -> KubeletView | str:
        try:
            return await read_kubelet(self.socket_path, timeout=self.kubelet_timeout)
        except KubeletUnavailable as err:
            return str(err)

    async def observe(self) -> Observation:
        async with asyncio.TaskGroup() as group:
            sysfs_task = group.create_task(self._sysfs())
            kubelet_task = group.create_task(self._kubelet())
        sysfs, kubelet = sysfs_task.result(), kubelet_task.result()
        if isinstance(sysfs, str) or isinstance(kubelet, str):
            reasons = [reason for reason in (kubelet, sysfs) if isinstance(reason, str)]
            return Observation(complete=False, inventory={},
                               problems=(*reasons, "the last complete report is kept"))
        pod_states = await self.pod_lookup(pods_to_look_up(sysfs, kubelet))
        inventory = build_inventory(sysfs, kubelet, pod_states)
        return Observation(complete=True, inventory=inventory.to_status(), problems=inventory.problems)

    # -- writing -------------------------------------------------------------------------

    def _due(self, observation: Observation) -> bool:
        if observation != self._written or self._written_at is None:
            return True
        return observation.complete and self._clock.now() - self._written_at >= self.report_interval

    async def publish(self, observation: Observation, *, force: bool = False) -> dict[str, Any] | None:
        """Write the observation when due (or forced); the status written, or ``None``."""
        if not force and not self._due(observation):
            return None
        status = observation.status(version=self.version, report_time=rfc3339(self._clock.wall()))
        await self.writer.write(status)
        self._written, self._written_at = observation, self._clock.now()
        return status

    # -- the loop ------------------------------------------------------------------------

    async def cycle(self) -> float:
        """One read and (maybe) write; the seconds to wait before the next cycle."""
        observation = await self.observe()
        try:
            written = await self.publish(observation)
        except kube_errors.KubeError as err:
            delay = self._backoff.next_delay()
            _log.warning("writing the GPUNode failed; retrying", retry_in=delay, error=str(err))
            return delay
        if written is not None:
            _log.info("reported", devices=len(observation.inventory.get("devices", [])),
                      resource_names=len(observation.inventory.get("resourceNames", [])),
                      problems=len(observation.problems), last_report_kept=not observation.complete)
        if not observation.complete:
            delay = self._backoff.next_delay()
            _log.warning("incomplete read; retrying", retry_in=delay, problems="; ".join(observation.problems))
            return delay
        self._backoff.reset()
        return self.interval

    async def once(self) -> tuple[Observation, dict[str, Any]]:
        """Read and write once, whatever was written before; for ``--once``."""
        observation = await self.observe()
        status = await self.publish(observation, force=True)
        assert status is not None
        return observation, status

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            delay = await self.cycle()
            with contextlib.suppress(TimeoutError):
                async with deadline(self._clock, delay):
                    await stop.wait()
