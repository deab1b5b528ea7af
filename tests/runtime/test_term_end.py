"""A term ends for real: a replica that lost its lease, or whose leader work will not stop, ends.

Real controller processes against the real API server (lease 4 s, renew
deadline 3 s, retry 0.5 s: leader work has 1 s to stop once its term is over).
Another holder is made to take the Lease by writing it, as a second replica
that saw it expire would; the replica notices on its next renewal.
"""

from __future__ import annotations

import datetime as dt

from cozygpu import keys
from cozygpu.api.times import micro_time
from cozygpu.kube import Client, resource_path
from cozygpu.runtime.process import HARD_EXIT_CODE
from tests.runtime.processes import (
    LEASE_DURATION,
    RENEW_DEADLINE,
    ControllerProcess,
    ControllerProcesses,
    controllers_fixture,  # noqa: F401 - the ``controllers`` fixture
)

STARTED, STOPPED = "leader-work-started", "leader-work-stopped"
ENTRY = ("tests.runtime.term_controller",)
#: How long a replica may take to end once its term is over: the time leader work has to stop, with room
#: for the process to notice (one renewal) and to start its stop; a wedged replica never ends at all.
EXIT_WITHIN = LEASE_DURATION - RENEW_DEADLINE + 2 * LEASE_DURATION


async def take_the_lease(admin: Client, namespace: str, holder: str) -> None:
    path = resource_path("coordination.k8s.io", "v1", "leases", namespace=namespace, name=keys.LEADER_LEASE)
    lease = await admin.get(path)
    now = micro_time(dt.datetime.now(dt.UTC))
    lease["spec"].update({"holderIdentity": holder, "acquireTime": now, "renewTime": now,
                          "leaseDurationSeconds": int(LEASE_DURATION),
                          "leaseTransitions": int(lease["spec"].get("leaseTransitions") or 0) + 1})
    await admin.replace(path, lease)


async def lease_holder(admin: Client, namespace: str) -> str:
    path = resource_path("coordination.k8s.io", "v1", "leases", namespace=namespace, name=keys.LEADER_LEASE)
    return str((await admin.get(path))["spec"].get("holderIdentity") or "")


def ended_hard(process: ControllerProcess) -> bool:
    return process.logged("ending the process hard")


async def test_a_replica_that_lost_its_lease_stops_its_work_and_exits_instead_of_campaigning_again(
    controllers: ControllerProcesses, admin: Client, namespace: str
) -> None:
    a = await controllers.start("a")
    await a.wait_event(STARTED, timeout=60)
    await take_the_lease(admin, namespace, "intruder")
    assert await a.exit_code(timeout=EXIT_WITHIN) == 1
    assert len(a.events(STARTED)) == len(a.events(STOPPED)) == 1
    assert not ended_hard(a), "its work stopped in time: an ordinary failing stop"
    assert await lease_holder(admin, namespace) == "intruder", "a lease it no longer held was not released"


async def test_leader_work_that_ignores_cancellation_after_a_lost_lease_ends_the_process_hard(
    controllers: ControllerProcesses, admin: Client, namespace: str
) -> None:
    a = await controllers.start("ignores-cancellation", entry=(*ENTRY, "ignores-cancellation"))
    await a.wait_event(STARTED, timeout=60)
    await take_the_lease(admin, namespace, "intruder")
    await a.wait_event("stubborn-cancelled", timeout=2 * LEASE_DURATION)
    assert await a.exit_code(timeout=EXIT_WITHIN) == HARD_EXIT_CODE
    assert ended_hard(a)
    assert a.events(STOPPED) == [], "the work never stopped: the process ended around it"
    assert len(a.events(STARTED)) == 1


async def test_leader_work_that_ignores_cancellation_on_sigterm_ends_the_process_hard(
    controllers: ControllerProcesses, admin: Client, namespace: str
) -> None:
    a = await controllers.start("ignores-cancellation", entry=(*ENTRY, "ignores-cancellation"))
    await a.wait_event(STARTED, timeout=60)
    a.terminate()
    await a.wait_event("stubborn-cancelled", timeout=LEASE_DURATION)
    assert await a.exit_code(timeout=EXIT_WITHIN) == HARD_EXIT_CODE
    assert ended_hard(a)
    assert a.events(STOPPED) == []
    assert not a.logged("released the lease"), "the lease runs out instead: its work ran until the end"


async def test_leader_work_that_blocks_the_event_loop_cannot_keep_the_process_past_its_lease(
    controllers: ControllerProcesses, admin: Client, namespace: str
) -> None:
    a = await controllers.start("blocks-the-loop", entry=(*ENTRY, "blocks-the-loop"))
    await a.wait_event("stubborn-blocking", timeout=60)
    # Nothing runs on the loop any more: no renewal, no stop; only the watchdog's thread can end it.
    assert await a.exit_code(timeout=LEASE_DURATION + EXIT_WITHIN) == HARD_EXIT_CODE
    assert ended_hard(a)
    assert a.events(STOPPED) == []
