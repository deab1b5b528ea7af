"""The binder's passes against the real API server, over a real cache (the pass driver is not involved here)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.kube import Client, resource_path
from cozygpu.views import specs
from tests.binder.world import GPUNODES, NODES, RunningBinder, World, seen_by, stamp


async def test_an_order_is_bound_onto_the_fullest_node_with_room(world: World, binder: RunningBinder) -> None:
    # n-a has 3 free of 8, n-b 8 of 8, n-c 1 of 2: an order of 2 goes to n-a, the fullest node with room.
    for short, units in (("n-a", 8), ("n-b", 8), ("n-c", 2)):
        await world.node(short, units)
    await world.order("held-a", 5, status=world.held("n-a"))
    await world.order("held-c", 1, status=world.held("n-c"))
    last = await world.order("new", 2)
    await seen_by(binder, specs.GPU_DEVICES.key, last)

    await binder.each_lane()

    status = (await world.device("new"))["status"]
    assert (status["phase"], status["nodeName"]) == ("Bound", world.node_name("n-a"))
    bound = next(c for c in status["conditions"] if c["type"] == "Bound")
    assert (bound["status"], bound["reason"]) == ("True", "Bound")


def bound_condition(device: dict[str, Any]) -> tuple[str, str, str]:
    found = next(c for c in device["status"]["conditions"] if c["type"] == "Bound")
    return found["status"], found["reason"], found["message"]


async def settle(binder: RunningBinder, world: World, *names: str) -> None:
    """Wait until the binder's cache holds the current version of each named device."""
    for name in names:
        await seen_by(binder, specs.GPU_DEVICES.key, await world.device(name))


async def test_an_order_over_the_budget_of_an_ancestor_stays_pending_with_the_budget_and_the_numbers(
        admin: Client, binder: RunningBinder) -> None:
    parent = f"tenant-{uuid.uuid4().hex[:8]}"
    child = f"{parent}-ml"
    for name in (parent, child):
        await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": name}})
    world = await World.make(admin, child)
    try:
        await admin.create(resource_path("", "v1", "resourcequotas", namespace=parent), {
            "metadata": {"name": keys.TENANT_QUOTA_NAME}, "spec": {"hard": {keys.QUOTA_TOTAL: "3"}}})
        await world.node("n1", 8)
        await world.order("held", 2, status=world.held("n1"))
        await world.order("over", 2)
        await settle(binder, world, "held", "over")

        await binder.each_lane()

        over = await world.device("over")
        assert over["status"].get("phase", "Pending") == "Pending"
        assert "nodeName" not in over["status"] or over["status"]["nodeName"] is None
        assert bound_condition(over) == (
            "False", "BudgetExceeded",
            f"not accepted: budget {keys.QUOTA_TOTAL} of {parent}: 3 allowed, 2 in use, order of 2 exceeds it by 1")
    finally:
        await world.cleanup()


async def test_a_vmis_two_devices_on_two_nodes_are_gathered_onto_one(world: World, binder: RunningBinder) -> None:
    await world.node("n1", 1)
    await world.node("n2", 4)
    attached = {"attachment": {"vmi": "vm", "attachedAt": stamp()}}
    await world.order("a", status={**world.held("n1"), **attached})
    await world.order("b", status={**world.held("n2"), **attached})
    await settle(binder, world, "a", "b")

    await binder.each_lane()

    a, b = await world.device("a"), await world.device("b")
    assert a["status"]["nodeName"] == b["status"]["nodeName"] == world.node_name("n2")
    assert bound_condition(a)[1] == "Gathered"


async def cordon(admin: Client, node: str) -> dict[str, Any]:
    made: dict[str, Any] = await admin.merge_patch(f"{NODES}/{node}", {"spec": {"unschedulable": True}})
    return made


async def test_a_cordoned_node_with_room_elsewhere_loses_its_set(world: World, binder: RunningBinder) -> None:
    await world.node("n1", 2)
    await world.node("n2", 2)
    await world.order("d", 2, status=world.held("n1"))
    await seen_by(binder, specs.NODES.key, await cordon(world.admin, world.node_name("n1")))
    await settle(binder, world, "d")

    await binder.each_lane()

    moved = await world.device("d")
    assert moved["status"]["nodeName"] == world.node_name("n2")
    assert bound_condition(moved)[:2] == ("True", "Moved")
    assert world.node_name("n1") in bound_condition(moved)[2]


@pytest.mark.parametrize("on_cordon", [None, "Stay"])
async def test_a_cordoned_set_stays_without_room_elsewhere_or_with_on_cordon_stay_and_its_request_succeeds(
        admin: Client, namespace: str, binder: RunningBinder, on_cordon: str | None) -> None:
    world = await World.make(admin, namespace, on_cordon=on_cordon)
    try:
        await world.node("n1", 2)
        # Room elsewhere only when the class says Stay: then the class, not the lack of room, keeps it.
        await world.node("n2", 2 if on_cordon else 1)
        await world.order("d", 2, status={**world.held("n1"), "attachment": {"vmi": "vm", "attachedAt": stamp()},
                                          "bindRequest": {"id": "r-1", "vmi": "vm"}})
        await seen_by(binder, specs.NODES.key, await cordon(admin, world.node_name("n1")))
        await settle(binder, world, "d")

        await binder.each_lane()

        stayed = await world.device("d")
        assert stayed["status"]["nodeName"] == world.node_name("n1")
        answer = stayed["status"]["bindAnswer"]
        assert (answer["id"], answer["result"], answer["node"]) == ("r-1", "Succeeded", world.node_name("n1"))
        assert bound_condition(stayed)[:2] == ("True", "StaysOnCordonedNode")
    finally:
        await world.cleanup()


async def test_a_node_gone_not_ready_moves_its_set_or_loses_it_and_a_lost_set_is_rebound_before_new_orders(
        world: World, binder: RunningBinder) -> None:
    await world.node("n1", 2)
    await world.node("n2", 2)
    await world.order("moves", 2, status=world.held("n1"))
    await world.order("loses", 2, status=world.held("n2"))
    await world.set_ready("n1", False)
    last = await world.admin.get(f"{NODES}/{world.node_name('n1')}")
    await seen_by(binder, specs.NODES.key, last)
    await settle(binder, world, "moves", "loses")

    # n1 is not Ready: "moves" has no room on n2 (held by "loses") → both cannot stay; n1's set goes Lost.
    await binder.each_lane()
    lost = await world.device("moves")
    assert (lost["status"]["phase"], lost["status"].get("nodeName")) == ("Lost", None)
    assert "not Ready" in bound_condition(lost)[2]

    # A new node with room for one set; a new order arrives too: the Lost set is rebound first.
    await world.node("n3", 2)
    await world.order("newer", 2)
    await seen_by(binder, specs.GPU_NODES.key, await world.admin.get(f"{GPUNODES}/{world.node_name('n3')}"))
    await settle(binder, world, "newer")

    await binder.each_lane()

    rebound, newer = await world.device("moves"), await world.device("newer")
    assert (rebound["status"]["phase"], rebound["status"]["nodeName"]) == ("Bound", world.node_name("n3"))
    assert bound_condition(rebound)[1] == "Rebound"
    assert newer["status"].get("phase", "Pending") == "Pending"
