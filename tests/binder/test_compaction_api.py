"""Compaction through the binder against the real API server (R-BIND-11): an order of 4 on four 4-GPU nodes,
each with three stopped single-GPU holds, is Bound after three moves, each with its Moved condition and Event
naming the order it made room for; with a VM's hold among them, only stopped holds move."""

from __future__ import annotations

import pytest

from cozygpu.commands import common
from cozygpu.commands.catalog import catalog_row, render_table
from cozygpu.model.catalog import catalog
from cozygpu.views import specs
from tests.binder.test_binder_api import bound_condition, settle
from tests.binder.test_writes_api import events_of
from tests.binder.world import RunningBinder, World, seen_by

NODES = ("c0", "c1", "c2", "c3")


async def fragment(world: World, *, attached: str = "") -> list[str]:
    """Four 4-GPU nodes with three single-GPU holds each; ``attached`` names the one hold a VM uses."""
    holds = []
    for short in NODES:
        await world.node(short, 4)
        for j in range(3):
            name = f"hold-{short}-{j}"
            status = {**world.held(short), **({"attachment": {"vmi": "vm"}} if name == attached else {})}
            await world.order(name, 1, status=status)
            holds.append(name)
    return holds


@pytest.mark.parametrize("attached", ["", "hold-c0-0"], ids=["all-stopped", "one-vm-on-c0"])
async def test_an_order_of_four_is_bound_after_moving_three_stopped_holds_each_with_its_event(
        world: World, binder: RunningBinder, attached: str) -> None:
    holds = await fragment(world, attached=attached)
    before = {name: (await world.device(name))["status"]["nodeName"] for name in holds}
    # The catalog answers an order of 4 as the webhook will: it fits, once stopped holds have moved.
    snapshot = (await common.read_cluster(world.admin)).snapshot
    [row] = [catalog_row(entry, snapshot, 4) for entry in catalog(snapshot, world.namespace)
             if entry.class_name == world.gpu_class]
    target = world.node_name("c1" if attached else "c0")  # c0 cannot be emptied while its VM's hold stays
    assert row["reason"] is None
    assert row["compaction"] == f"placed on {target} after moving 3 stopped holds"
    assert "4 after compaction" in render_table([row], count=4)
    await settle(binder, world, *holds)
    await binder.each_lane()  # a plan over everything (it writes the holds' Bound conditions)
    await binder.each_lane()  # nothing to do: the next cycle plans only what changed since
    last = await world.order("big", 4)
    await seen_by(binder, specs.GPU_DEVICES.key, last)

    await binder.each_lane()  # its view holds the order alone; the holds it moves are outside it

    big = (await world.device("big"))["status"]
    assert (big["phase"], big["nodeName"]) == ("Bound", target)
    moved = {}
    for name in holds:
        device = await world.device(name)
        if device["status"]["nodeName"] != before[name]:
            moved[name] = device
    assert sorted(moved) == sorted(name for name in holds if before[name] == target)
    assert attached not in moved
    for name, device in moved.items():
        status, reason, message = bound_condition(device)
        assert (status, reason) == ("True", "Moved")
        assert f"room made on node {target} for GPUDevice {world.namespace}/big" in message
        assert device["status"]["nodeName"] != target
        assert ("Moved", message) in await events_of(world.admin, world.namespace, name)
    [family] = binder.metrics.compaction_moves.collect()
    assert [s.value for s in family.samples if s.name == "cozygpu_binder_compaction_moves_total"] == [3.0]
    # No node holds more than it serves.
    per_node: dict[str, int] = {}
    for name in [*holds, "big"]:
        status = (await world.device(name))["status"]
        per_node[status["nodeName"]] = per_node.get(status["nodeName"], 0) + (4 if name == "big" else 1)
    assert max(per_node.values()) <= 4
