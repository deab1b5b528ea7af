"""Losing a controller replica refuses no order once the balancer has dropped it (issue 22, item 6).

The demo's platform on a full local plane of its own (everything on
loopback): two controller replicas under the supervisor, the webhooks
registered at the balancer in front of them. While a steady stream of
GPUDevice orders (dry runs, one every ``INTERVAL``) goes through the API
server, one replica (the leader, then the standby) is killed (SIGKILL), or
frozen (SIGSTOP) past its lease and then continued. Each case waits until the
replica is back among the endpoints (started again by the supervisor where it
ended) and prints how many orders were refused, when, and the window between
the signal and the balancer dropping the replica. Refusals are allowed only
for orders under way in that window; none after it.

``python -m pytest tests/devcluster/test_replicas.py -s`` prints the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from cozygpu import keys
from cozygpu.devcluster import binaries, demo, replicas, story
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path
from tests.support.planes import unavailable
from tests.support.processes import gone
from tests.support.waiting import eventually

#: One order every this many seconds, each on its own (a slow answer does not hold the next one back).
INTERVAL = 0.1
#: Orders before the signal (all must be admitted) and after the replica is back.
STEADY = 2.0
#: The demo's replicas run with the controller's default lease (15 s): a freeze lasts past it.
LEASE = 15.0
FREEZE = LEASE + 3.0
LEASE_PATH = resource_path("coordination.k8s.io", "v1", "leases", namespace=demo.CONTROLLER_NAMESPACE,
                           name=keys.LEADER_LEASE)


def cozygpu(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cozygpu", *args], capture_output=True, text=True,
                          check=False, timeout=timeout)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The demo's platform (and its story told once) on a full plane of its own, stopped after the module."""
    built = binaries.find(binaries.DEFAULT_MINOR)
    if built is None or not built.full:
        unavailable(f"the full control plane's binaries for Kubernetes {binaries.DEFAULT_MINOR} are not built")
    directory = tmp_path_factory.mktemp("replicas") / "cluster"
    started = cozygpu("cluster", "start", "--dir", str(directory))
    assert started.returncode == 0, started.stderr
    plane = ControlPlane.attach(directory)
    try:
        told = cozygpu("cluster", "demo", "--dir", str(directory))
        assert told.returncode == 0, f"{told.stdout}\n{told.stderr}"
        yield plane
    finally:
        pids = [int(p.read_text()) for p in directory.glob("*.pid")]
        stopped = cozygpu("cluster", "stop", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr
        for pid in pids:
            assert gone(pid), f"cozygpu cluster stop left pid {pid} running"


@attrs.define
class Order:
    sent: float
    done: float = 0.0
    refusal: str | None = None


@attrs.define
class Stream:
    """Dry-run GPUDevice orders of 1 H100 in tenant-beta, one every ``INTERVAL``, each timed."""

    admin: Client
    orders: list[Order] = attrs.field(factory=list)

    async def _one(self, order: Order) -> None:
        try:
            await self.admin.create(story.device_path(story.BETA), story.order("stream", "h100", 1), dry_run=True,
                                    attempts=1)
        except (errors.KubeError, TimeoutError) as error:
            order.refusal = str(error) or type(error).__name__
        order.done = time.monotonic()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Stream]:
        async with asyncio.TaskGroup() as group:
            async def send() -> None:
                while True:
                    order = Order(time.monotonic())
                    self.orders.append(order)
                    group.create_task(self._one(order))
                    await asyncio.sleep(INTERVAL)

            sender = group.create_task(send())
            try:
                yield self
            finally:
                sender.cancel()  # the orders under way are awaited by the group


def state(directory: Path) -> dict[str, Any]:
    found = replicas.read_state(directory)
    assert found is not None, "the supervisor has written no state"
    return found


def endpoints_ready(directory: Path) -> bool:
    return all(e["ready"] for e in state(directory)["balancer"]["endpoints"])


def starts(directory: Path, name: str) -> int:
    return int(next(r["starts"] for r in state(directory)["replicas"] if r["name"] == name))


def dropped_at(directory: Path, name: str, since: float) -> float | None:
    """When the balancer last dropped ``name`` after ``since`` (monotonic), if it has."""
    for event in reversed(state(directory)["balancer"]["events"]):
        if event["endpoint"] == name and not event["ready"] and event["at"] >= since:
            return float(event["at"])
    return None


def answering_again(directory: Path, name: str, first_start: int) -> float | None:
    """When ``name``, started again since its start number ``first_start``, first passed the balancer's probe."""
    found = state(directory)
    replica = next(r for r in found["replicas"] if r["name"] == name)
    endpoint = next(e for e in found["balancer"]["endpoints"] if e["name"] == name)
    if replica["starts"] > first_start and endpoint["lastProbe"] == "200" and endpoint["ready"] \
            and endpoint["lastProbeAt"] > replica["started"]:
        return float(endpoint["lastProbeAt"])
    return None


def rejoined_at(directory: Path, name: str, since: float) -> float | None:
    for event in state(directory)["balancer"]["events"]:
        if event["endpoint"] == name and event["ready"] and event["at"] > since:
            return float(event["at"])
    return None


async def holder(admin: Client) -> str:
    return str((await admin.get(LEASE_PATH))["spec"].get("holderIdentity") or "")


CASES = [("leader", signal.SIGKILL), ("standby", signal.SIGKILL), ("leader", signal.SIGSTOP),
         ("standby", signal.SIGSTOP)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("role", "signum"), CASES, ids=[f"{r}-{s.name}" for r, s in CASES])
async def test_losing_a_replica_refuses_no_order_once_the_balancer_has_dropped_it(
    platform: ControlPlane, role: str, signum: signal.Signals
) -> None:
    directory = platform.directory
    async with platform.client() as admin:
        await eventually(lambda: asyncio.to_thread(endpoints_ready, directory), timeout=120,
                         what="both replicas among the balancer's endpoints")
        leader = await eventually(lambda: holder(admin), timeout=60, what="a replica leading")
        target = leader if role == "leader" else next(n for n in demo.REPLICAS if n != leader)
        other = next(n for n in demo.REPLICAS if n != target)
        pid = int((directory / f"{target}.pid").read_text())
        first_start = starts(directory, target)
        log = directory / "logs" / f"{target}.log"
        log_from = log.stat().st_size

        stream = Stream(admin)
        async with stream.running():
            await asyncio.sleep(STEADY)  # a steady stream before the signal (time passing is the point)
            signalled = time.monotonic()
            os.kill(pid, signum)
            dropped: float | None
            if signum == signal.SIGKILL:
                # Started again, and answering its probe: a restart faster than two probe periods keeps it
                # among the endpoints (never dropped), else it left and came back.
                back = await eventually(lambda: asyncio.to_thread(answering_again, directory, target, first_start),
                                        timeout=120, what=f"{target} started again and passing its probe")
                dropped = left = dropped_at(directory, target, signalled)
                if left is not None:
                    back = await eventually(lambda: asyncio.to_thread(rejoined_at, directory, target, left),
                                            timeout=120, what=f"{target} back among the endpoints")
            else:
                dropped = await eventually(lambda: asyncio.to_thread(dropped_at, directory, target, signalled),
                                           timeout=30, what=f"the balancer dropping {target}")
                if role == "leader":
                    await eventually(lambda: _holds(admin, other), timeout=3 * LEASE,
                                     what=f"{other} taking the lease of frozen {target}")
                await asyncio.sleep(max(0.0, signalled + FREEZE - time.monotonic()))  # frozen past the lease
                continued = time.monotonic()
                os.kill(pid, signal.SIGCONT)
                back = await eventually(lambda: asyncio.to_thread(rejoined_at, directory, target, dropped),
                                        timeout=120, what=f"{target} back among the endpoints")
            await asyncio.sleep(STEADY)  # and a steady stream after it is back
        restarted = starts(directory, target) > first_start

    # The window: from the signal until the balancer dropped the replica; none when it never left.
    window_end = dropped if dropped is not None else signalled
    refused = [o for o in stream.orders if o.refusal is not None]
    late = [o for o in refused if o.sent > window_end]
    early = [o for o in refused if o.done < signalled]
    what = f"{role} {target} {signum.name}"
    window = (f"the balancer dropped {target} {dropped - signalled:.2f} s after the signal (the window)"
              if dropped is not None else f"{target} was started again and passed its probe before its probe "
              "failed twice: never dropped (no window)")
    print(f"\n{what}: {len(stream.orders)} orders, {len(refused)} refused; {window}; {target} back "
          f"after {back - signalled:.1f} s ({'started again by the supervisor' if restarted else 'the same process'})")
    if refused:
        first, last = refused[0].sent - signalled, refused[-1].sent - signalled
        answered = max(o.done for o in refused) - signalled
        print(f"  refused orders sent from {first:+.2f} s to {last:+.2f} s after the signal, answered by "
              f"{answered:+.2f} s; the first: {refused[0].refusal}")
    assert early == [], f"{what}: orders refused before the signal: {early[0].refusal}"
    assert late == [], (f"{what}: {len(late)} orders sent after the window were refused, "
                        f"the first {late[0].sent - window_end:.2f} s after: {late[0].refusal}")
    if signum == signal.SIGKILL or role == "leader":
        assert restarted, f"the supervisor did not start {target} again"
        assert gone(pid)
    if signum == signal.SIGSTOP and role == "leader":
        ended = log.read_text(errors="replace")[log_from:]
        assert "ending the process hard" in ended, f"continued past its lease, {target} did not end itself"
        assert "within -" not in ended
        line = next(line for line in ended.splitlines() if "ending the process hard" in line)
        print(f"  {target} continued {continued - signalled:.1f} s after the freeze: {line.strip()}")


async def _holds(admin: Client, name: str) -> bool:
    return await holder(admin) == name
