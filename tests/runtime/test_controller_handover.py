"""Two controller processes against the real API server: one leads, and leadership moves on signals.

Durations: lease 4 s, renew deadline 3 s, retry 0.5 s (so a candidate tries at
most every 0.5 s + 1.2 x 0.5 s of jitter = 1.1 s).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import time

from cozygpu import keys
from cozygpu.kube import Client, resource_path
from tests.runtime.processes import (
    LEASE_DURATION,
    RETRY_PERIOD,
    ControllerProcess,
    ControllerProcesses,
    controllers_fixture,  # noqa: F401 - the ``controllers`` fixture
    leader_intervals,
)

#: The longest a candidate waits between two tries.
MAX_RETRY_WAIT = RETRY_PERIOD * 2.2
STARTED = "leader-work-started"


async def first_leader(*candidates: ControllerProcess, timeout: float = 60) -> ControllerProcess:
    waits = {asyncio.ensure_future(c.wait_event(STARTED, timeout=timeout)): c for c in candidates}
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        task = done.pop()
        task.result()
        return waits[task]
    finally:
        for task in waits:
            task.cancel()


async def leader_and_follower(controllers: ControllerProcesses) -> tuple[ControllerProcess, ControllerProcess]:
    """Two replicas, once one leads and the other has renewed its view of the lease for a second."""
    a = await controllers.start("a")
    b = await controllers.start("b")
    leader = await first_leader(a, b)
    await asyncio.sleep(1)
    return leader, b if leader is a else a


async def lease_spec(admin: Client, namespace: str) -> dict[str, object]:
    path = resource_path("coordination.k8s.io", "v1", "leases", namespace=namespace, name=keys.LEADER_LEASE)
    spec: dict[str, object] = (await admin.get(path))["spec"]
    return spec


def assert_never_both(processes: list[ControllerProcess]) -> None:
    intervals = sorted(leader_intervals(processes), key=lambda i: i[1])
    assert intervals, "nobody led: the check proves nothing"
    for (who, _, end), (next_who, next_start, _) in itertools.pairwise(intervals):
        assert end <= next_start, f"{who} still ran leader work when {next_who} started: {intervals}"


async def test_of_two_controllers_exactly_one_leads_and_writes_lease_times_in_utc(
    controllers: ControllerProcesses, admin: Client, namespace: str
) -> None:
    # Neither machine zone is UTC: the lease times must be UTC all the same.
    a = await controllers.start("a", env={"TZ": "Asia/Tokyo"})
    b = await controllers.start("b", env={"TZ": "America/Los_Angeles"})
    leader = await first_leader(a, b)
    other = b if leader is a else a
    await asyncio.sleep(3 * LEASE_DURATION)
    assert other.events(STARTED) == []
    assert len(leader.events(STARTED)) == 1
    spec = await lease_spec(admin, namespace)
    assert spec["holderIdentity"] == leader.identity
    assert spec["leaseDurationSeconds"] == 4
    renewed = dt.datetime.strptime(str(spec["renewTime"]), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    assert abs((dt.datetime.now(dt.UTC) - renewed).total_seconds()) < 2 * RETRY_PERIOD + 1
    settings = await admin.get(resource_path("", "v1", "configmaps", namespace=namespace,
                                             name=keys.SETTINGS_CONFIGMAP))
    assert settings["data"][keys.SETTINGS_GPU_ENABLED] == "false"


async def test_sigterm_of_the_leader_releases_the_lease_and_the_other_leads_next(
    controllers: ControllerProcesses, admin: Client, namespace: str
) -> None:
    leader, other = await leader_and_follower(controllers)
    sent = time.monotonic()
    leader.terminate()
    took_over = await other.wait_event(STARTED, timeout=3 * LEASE_DURATION)
    handover = float(took_over["monotonic"]) - sent
    assert await leader.exit_code(timeout=10) == 0
    assert leader.logged("released the lease")
    # The figure is printed, never asserted: the standby watches the Lease and campaigns on its release.
    print(f"SIGTERM handover: {handover:.3f} s")
    spec = await lease_spec(admin, namespace)
    assert spec["holderIdentity"] == other.identity
    assert spec["leaseTransitions"] == 1
    assert_never_both([leader, other])


async def test_sigkill_of_the_leader_hands_over_once_the_lease_runs_out(
    controllers: ControllerProcesses, admin: Client, namespace: str
) -> None:
    leader, other = await leader_and_follower(controllers)
    dead = await leader.kill()
    took_over = await other.wait_event(STARTED, timeout=4 * LEASE_DURATION)
    handover = float(took_over["monotonic"]) - dead
    print(f"SIGKILL handover: {handover:.3f} s")
    # The lease was renewed at most one retry period before the kill and is never taken before it runs out
    # on the candidate's own clock; the candidate notices within two of its tries.
    assert handover >= LEASE_DURATION - RETRY_PERIOD - MAX_RETRY_WAIT
    assert handover <= LEASE_DURATION + 2 * MAX_RETRY_WAIT
    spec = await lease_spec(admin, namespace)
    assert spec["holderIdentity"] == other.identity
    assert spec["leaseTransitions"] == 1
    assert_never_both([leader, other])


async def test_leader_work_never_runs_in_two_processes_at_once_across_handovers(
    controllers: ControllerProcesses, namespace: str
) -> None:
    a = await controllers.start("a")
    b = await controllers.start("b")
    everyone = [a, b]
    leader = await first_leader(a, b)
    leader.terminate()
    c = await controllers.start("c")
    everyone.append(c)
    survivors = [p for p in everyone if p is not leader]
    leader = await first_leader(*survivors)
    await asyncio.sleep(2)
    await leader.kill()
    survivors = [p for p in survivors if p is not leader]
    leader = await first_leader(*survivors)
    await asyncio.sleep(2)
    for process in survivors:
        process.terminate()
    for process in survivors:
        assert await process.exit_code(timeout=15) == 0
    assert sum(len(p.events(STARTED)) for p in everyone) == 3
    assert_never_both(everyone)
