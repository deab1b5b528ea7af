"""Controller processes for the tests: ``python -m cozygpu controller`` with its JSON log lines parsed.

``ControllerProcesses`` is the ``controllers`` fixture's object: ``start(identity,
*flags)`` spawns one replica against the test's control plane; every JSON
line it logs is kept with the host's monotonic time of arrival; ``wait_for``
waits for a line matching a predicate. Every process still running when the
test ends is killed and reaped, so none outlives its test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import pytest

from cozygpu.devcluster.plane import ControlPlane

REPO = Path(__file__).resolve().parents[2]

#: Leader-election durations short enough for tests: lease 4 s, renew deadline 3 s, retry 0.5 s.
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 4.0, 3.0, 0.5
SHORT_ELECTION = ("--lease-duration", "4s", "--renew-deadline", "3s", "--retry-period", "500ms")

Line = dict[str, Any]


class ControllerProcess:
    def __init__(self, identity: str, proc: asyncio.subprocess.Process) -> None:
        self.identity = identity
        self.proc = proc
        self.lines: list[Line] = []
        self.raw: list[str] = []
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read(), name=f"log reader {identity}")
        #: Host monotonic time at which the process was known dead after SIGKILL.
        self.killed_at: float | None = None

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            text = raw.decode(errors="replace").rstrip("\n")
            self.raw.append(text)
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if isinstance(line, dict):
                self.lines.append(line)
                self._changed.set()
        self._changed.set()

    def events(self, event: str) -> list[Line]:
        return [line for line in self.lines if line.get("event") == event]

    def logged(self, msg: str) -> bool:
        return any(line.get("msg") == msg for line in self.lines)

    async def wait_for(self, match: Callable[[Line], bool], *, timeout: float) -> Line:
        async with asyncio.timeout(timeout):
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    if match(line):
                        return line
                seen = len(self.lines)
                if self._reader.done():
                    raise AssertionError(f"{self.identity} exited (rc={self.proc.returncode}) before the line "
                                         f"appeared:\n" + "\n".join(self.raw[-30:]))
                self._changed.clear()
                await self._changed.wait()

    async def wait_event(self, event: str, *, timeout: float, after: int = 0) -> Line:
        """The first ``event`` line with index >= ``after`` among that event's lines."""
        count = {"n": 0}

        def match(line: Line) -> bool:
            if line.get("event") != event:
                return False
            count["n"] += 1
            return count["n"] > after

        return await self.wait_for(match, timeout=timeout)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    async def kill(self) -> float:
        self.proc.kill()
        await self.proc.wait()
        self.killed_at = time.monotonic()
        return self.killed_at

    async def exit_code(self, *, timeout: float) -> int:
        async with asyncio.timeout(timeout):
            code = await self.proc.wait()
            await self._reader
        return code

    async def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Logged(Protocol):
    """What ``interleaved_decisions`` reads of a process: its identity and its parsed log lines."""

    identity: str
    lines: list[Line]


def interleaved_decisions(processes: Sequence[Logged]) -> list[str]:
    """Where two replicas' decision writes interleave in the API server's order (empty when they never do).

    Every device write the binder saw accepted is logged (``device written``) with the resourceVersion the
    server gave it, which orders all writes. A process leads one term at most (it ends with it), so in that
    order each process's writes must form one run (a restarted replica is another process): a write of one
    after another's began means two leaders' decisions were taken in one term (leader election does not
    fence; the fence must).
    """
    writes = sorted((int(line["resource_version"]), f"{process.identity} (process {index})")
                    for index, process in enumerate(processes) for line in process.lines
                    if line.get("msg") == "device written" and str(line.get("resource_version", "")).isdigit())
    ended: dict[str, int] = {}
    breaches: list[str] = []
    previous: tuple[int, str] | None = None
    for version, identity in writes:
        if previous is not None and previous[1] != identity:
            ended[previous[1]] = previous[0]
            if identity in ended:
                breaches.append(f"{identity} wrote a decision at resourceVersion {version}, after "
                                f"{previous[1]}'s at {previous[0]} (its own run had ended at {ended[identity]})")
        previous = (version, identity)
    return breaches


#: How a replica is started: ``python -m cozygpu controller``, or a test's own entry module.
CONTROLLER: Final = ("cozygpu", "controller")


async def spawn(argv: Sequence[str], *, env: dict[str, str] | None = None,
                entry: Sequence[str] = CONTROLLER) -> asyncio.subprocess.Process:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", *entry, *argv,
        cwd=REPO, env=environ, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )


class ControllerProcesses:
    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.started: list[ControllerProcess] = []

    async def start(self, identity: str, *extra: str, env: dict[str, str] | None = None,
                    entry: Sequence[str] = CONTROLLER) -> ControllerProcess:
        argv = ["--kubeconfig", str(self.kubeconfig), "--namespace", self.namespace, "--identity", identity,
                "--health-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--log-format", "json",
                *SHORT_ELECTION, *extra]
        process = ControllerProcess(identity, await spawn(argv, env=env, entry=entry))
        self.started.append(process)
        return process

    async def close(self) -> None:
        for process in self.started:
            await process.close()


@pytest.fixture(name="controllers")
async def controllers_fixture(plane: ControlPlane, namespace: str) -> AsyncIterator[ControllerProcesses]:
    """Replicas against the test's control plane, in the test's namespace; all killed at the end."""
    processes = ControllerProcesses(plane.kubeconfig, namespace)
    try:
        yield processes
    finally:
        await processes.close()


def leader_intervals(processes: Sequence[ControllerProcess]) -> list[tuple[str, float, float]]:
    """(identity, start, end) of every term of leader work, on the host's monotonic clock.

    A term still open when its process was SIGKILLed ends when the process was
    known dead; one still open otherwise ends now (it is still running).
    """
    intervals: list[tuple[str, float, float]] = []
    for process in processes:
        start: float | None = None
        for line in process.lines:
            if line.get("event") == "leader-work-started":
                assert start is None, f"{process.identity}: two starts without a stop"
                start = float(line["monotonic"])
            elif line.get("event") == "leader-work-stopped":
                assert start is not None, f"{process.identity}: a stop without a start"
                intervals.append((process.identity, start, float(line["monotonic"])))
                start = None
        if start is not None:
            end = process.killed_at if process.killed_at is not None else time.monotonic()
            intervals.append((process.identity, start, end))
    return intervals
