"""The safety net (R-BIND-1): a live read model that drifted from the stores is found, counted and repaired.

A delta is broken on purpose (a node's capacity is no longer refreshed when a
device changes it), so the binder's live snapshot misses a hold that the API
server has: its own check against a build from the stores names the first
difference, counts it in ``cozygpu_read_model_drift_total``, and the next
snapshot is right again.
"""

from __future__ import annotations

import pytest

from cozygpu.kube import Client
from cozygpu.views import specs
from tests.binder.world import World, running_binder, seen_by
from tests.views.test_live_snapshot import break_node_refresh_in_updates


async def test_a_broken_delta_is_counted_and_repaired_by_the_check_against_the_stores(
        admin: Client, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    world = await World.make(admin, namespace)
    node = await world.node("n1", 4)
    try:
        async with running_binder(admin) as running:
            await running.binder.snapshot()  # the live model, built from the stores
            assert await running.binder.verify_model() is None
            break_node_refresh_in_updates(monkeypatch)
            held = await world.order("held", 3, status=world.held("n1"))
            await seen_by(running, specs.GPU_DEVICES.key, held)
            snapshot, _, _ = await running.binder.snapshot()
            assert snapshot.capacity[node][world.resource].held == 0, "the broken delta missed the hold"

            assert await running.binder.verify_model() == f"capacity[{node!r}]"
            [family] = running.metrics.drift.collect()
            assert [s.value for s in family.samples if s.name == "cozygpu_read_model_drift_total"] == [1.0]
            monkeypatch.undo()
            repaired, _, _ = await running.binder.snapshot()
            assert repaired.capacity[node][world.resource].held == 3
    finally:
        await world.cleanup()
