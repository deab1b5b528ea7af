"""The binder's passes against the real API server, over a real cache (the pass driver is not involved here)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cozygpu.cache import specs
from cozygpu.kube import Client
from tests.binder.world import RunningBinder, World, running_binder, seen_by


@pytest.fixture
async def world(admin: Client, namespace: str) -> AsyncIterator[World]:
    made = await World.make(admin, namespace)
    yield made
    await made.cleanup()


@pytest.fixture
async def binder(admin: Client) -> AsyncIterator[RunningBinder]:
    async with running_binder(admin) as running:
        yield running


async def test_an_order_is_bound_onto_the_fullest_node_with_room(world: World, binder: RunningBinder) -> None:
    # n-a has 3 free of 8, n-b 8 of 8, n-c 1 of 2: an order of 2 goes to n-a, the fullest node with room.
    for short, units in (("n-a", 8), ("n-b", 8), ("n-c", 2)):
        await world.node(short, units)
    await world.order("held-a", 5, status=world.held("n-a"))
    await world.order("held-c", 1, status=world.held("n-c"))
    last = await world.order("new", 2)
    await seen_by(binder, specs.GPU_DEVICES.key, last)

    await binder.full_pass()

    status = (await world.device("new"))["status"]
    assert (status["phase"], status["nodeName"]) == ("Bound", world.node_name("n-a"))
    bound = next(c for c in status["conditions"] if c["type"] == "Bound")
    assert (bound["status"], bound["reason"]) == ("True", "Bound")
