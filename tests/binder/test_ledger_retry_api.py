"""A hold whose ledger write a pass did not get taken is judged again by the next pass (R-LEDGER-2).

The ledger lane stops between writes when a placement pass is due (a housekeeping pass yields to
placement). Its warning's deadline was spent on the pass that judged it, so a hold whose write was left
unsent went unwarned until its release deadline, and was released without a warning (seen on the full
plane: ``test_ledger_full_plane_api.py`` failed 'kept warned' when a placement pass came due after the
first of two warnings).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from cozygpu.binder.ledger import EXPIRING_CONDITION
from cozygpu.kube import Client
from cozygpu.passes.driver import Progress
from cozygpu.passes.writes import Writes
from cozygpu.views import specs
from tests.binder.support import class_path
from tests.binder.world import World, running_binder, seen_by


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_warning_left_unsent_when_placement_came_due_is_written_by_the_next_pass(
        admin: Client, namespace: str) -> None:
    world = await World.make(admin, namespace)
    await world.node("n1", 4)
    await admin.merge_patch(class_path(world.gpu_class), {"spec": {"idleHoldLimit": "10h", "idleHoldWarning": "2h"}})
    # Idle for a little under 8 h: the warning falls due a few seconds from now.
    idle_since = stamp(datetime.now(UTC) - timedelta(hours=8) + timedelta(seconds=3))
    for name in ("a", "b"):
        await world.order(name, status={**world.held("n1"), "heldSince": idle_since, "idleSince": idle_since})
    try:
        async with running_binder(admin) as running:
            ledger = running.binder.ledger
            due = asyncio.Event()
            ledger.queue.on_ready(due.set)
            assert await ledger.run(Writes()) is Progress.DONE  # every hold judged: nothing due yet
            assert [n for n in ("a", "b") if await warned(world, n)] == []
            await due.wait()  # the warnings' deadline
            # That pass sends one warning, then a placement pass is due and it stops.
            assert await ledger.run(Writes(), lambda: True) is Progress.MORE
            [first] = [n for n in ("a", "b") if await warned(world, n)]
            await seen_by(running, specs.GPU_DEVICES.key, await world.device(first))
            # The next pass: nothing of the other hold changed and its deadline was spent, yet it is warned.
            await ledger.run(Writes())
            assert [n for n in ("a", "b") if await warned(world, n)] == ["a", "b"]
    finally:
        await world.cleanup()


async def warned(world: World, name: str) -> bool:
    conditions = (await world.device(name))["status"].get("conditions", ())
    return any(c["type"] == EXPIRING_CONDITION for c in conditions)
