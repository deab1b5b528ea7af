"""The claims work's pure parts (SPEC §1.5): which claim events ask for a pass, what one device's plan is, and
that judging the devices that moved, one at a time, leaves what planning every hold at once leaves."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import attrs
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.api import claims as claims_api
from cozygpu.binder import claims
from cozygpu.binder.binder import _claim_worth_a_pass
from cozygpu.binder.claims import device_plan, keys_changed
from cozygpu.cache.frozen import FrozenDict, freeze
from cozygpu.cache.store import Event
from cozygpu.devcluster import dra_driver
from cozygpu.model.dra import DeviceRef
from cozygpu.model.dra_claims import ClaimAction, claim_plan
from cozygpu.model.dra_tracker import DraTracker
from cozygpu.model.snapshot import DeviceKey, Phase, Snapshot
from cozygpu.views.decode_dra import resource_claim_view
from tests.binder.test_claims_keys import CLAIM, NS, Harness, dra_world
from tests.binder.test_claims_keys import hold as gpu_device

NOW_WALL = datetime(2026, 12, 6, tzinfo=UTC)


def frozen(obj: dict[str, Any]) -> FrozenDict:
    value: FrozenDict = freeze(obj)
    return value


def hold(name: str, *, node: str | None = None, owned: bool = True) -> dict[str, Any]:
    body = claims_api.hold_claim(name, f"uid-{name}", device_class=dra_driver.DEVICE_CLASS, count=1)
    body["metadata"].update(namespace="tenant-a", resourceVersion="1")
    if not owned:
        body["metadata"]["ownerReferences"] = []
    if node is not None:
        body["status"] = claims_api.hold_status(node, [DeviceRef(dra_driver.DRIVER, node, dra_driver.device_name(0))],
                                                device_name=name, device_uid=f"uid-{name}", now=NOW_WALL)
    return body


def test_the_binders_own_hold_claim_made_or_allocated_asks_for_no_pass_and_anything_else_does() -> None:
    """A burst's claims were written one or two a pass: each of the binder's own claim events asked for a
    placement pass, which stopped the claims work between holds."""
    made, allocated = frozen(hold("gpu-a")), frozen(hold("gpu-a", node="n1"))
    assert not _claim_worth_a_pass(Event("ResourceClaim", "ADDED", made)), "the binder allocates it at once"
    assert not _claim_worth_a_pass(Event("ResourceClaim", "MODIFIED", allocated, made)), "its own allocation"
    assert _claim_worth_a_pass(Event("ResourceClaim", "MODIFIED", made, allocated)), "a hold deallocated"
    assert _claim_worth_a_pass(Event("ResourceClaim", "DELETED", allocated, allocated)), "a hold gone"
    foreign = frozen(hold("pod-claim", node="n1", owned=False))
    assert _claim_worth_a_pass(Event("ResourceClaim", "ADDED", foreign)), "someone else's claim takes GPUs"


def test_a_hold_claim_whose_device_holds_nothing_is_released_unless_a_vm_it_is_attached_to_exists() -> None:
    world = dra_world({"n1": 2})
    for name in ("gone", "unbound", "running", "expired"):
        world.put(CLAIM, allocated_hold(name, "n1"))
    world.put(keys.GPUDEVICE_KIND, gpu_device("unbound", None, phase="Pending"))
    world.put(keys.GPUDEVICE_KIND, gpu_device("running", "n1", phase="Lost", vmi="vm"))
    world.put(keys.GPUDEVICE_KIND, gpu_device("expired", None, phase="Released"))  # its idle hold released (R-LEDGER-2)
    world.put("VirtualMachineInstance", {"metadata": {"name": "vm", "namespace": NS, "uid": "uid-vm",
                                                      "resourceVersion": "1"}, "spec": {}, "status": {}})
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    assert snapshot.devices[(NS, "running")].phase is Phase.LOST
    keys_now = keys_changed(snapshot, None, world.live.dra)
    assert keys_now == [(NS, "expired"), (NS, "gone"), (NS, "running"), (NS, "unbound")], \
        "after a rebuild: every hold claim's device"
    plans = {key[1]: device_plan(snapshot, world.live.dra, key) for key in keys_now}
    assert {name for name, plan in plans.items() if plan.release} == {"expired", "gone", "unbound"}, \
        "a Lost device's claim stays while its VM exists: the launcher runs on it (R-BIND-7)"
    assert all(plan.steps == () for plan in plans.values())


def allocated_hold(name: str, node: str, *indexes: int, namespace: str = NS, owned: bool = True) -> dict[str, Any]:
    """A claim allocated the simulated GPUs ``indexes`` (default the first) of ``node``; a hold of the
    device of its name, or someone else's."""
    body = claims_api.hold_claim(name, f"uid-{name}", device_class=dra_driver.DEVICE_CLASS, count=1)
    body["metadata"].update(namespace=namespace, resourceVersion="1")
    if not owned:
        body["metadata"]["ownerReferences"] = []
    refs = [DeviceRef(dra_driver.DRIVER, node, dra_driver.device_name(i)) for i in (indexes or (0,))]
    body["status"] = claims_api.hold_status(node, refs, device_name=name, device_uid=f"uid-{name}", now=NOW_WALL)
    return body


def whole_fleet_plan(snapshot: Snapshot, dra: DraTracker) -> claims.ClaimsPlan:
    """The plan over every hold at once (what the claims work planned before it was keyed): the reference."""
    own = {key: claim for key, claim in dra.claims.items() if claim.is_hold}
    used = {key for key in snapshot.devices if claims.in_use(snapshot, key)}
    holds = [d for d in snapshot.devices.values() if snapshot.sells_dra(d.class_name)]
    nodes = {d.node_name for d in holds if d.node_name is not None}
    units = {name: attrs.evolve(offer, by_node={node: tuple(ref for ref in offer.by_node.get(node, ())
                                                            if not dra.foreign(ref)) for node in nodes})
             for name, offer in dra.units.items()}
    steps = claim_plan(holds, snapshot.classes, own, units, dra.attrs_of, in_use=used)
    release = tuple(sorted(key for key in own if key not in used and not (
        (d := snapshot.devices.get(key)) is not None and d.holds_units and snapshot.sells_dra(d.class_name))))
    return claims.ClaimsPlan(steps=tuple(steps), release=release)


NAMES = ("d0", "d1", "d2", "d3")
NODES = ("n1", "n2")
EVENTS = st.one_of(
    st.tuples(st.just("device"), st.sampled_from(NAMES), st.sampled_from((None, *NODES)),
              st.sampled_from(("Bound", "Bound", "Pending", "Lost")), st.integers(1, 2),
              st.sampled_from((None, "vm1", "vm2")), st.sampled_from(("dra", "dra", "other"))),
    st.tuples(st.just("device gone"), st.sampled_from(NAMES)),
    st.tuples(st.just("vmi"), st.sampled_from(("vm1", "vm2")), st.booleans()),
    st.tuples(st.just("foreign"), st.sampled_from(("p1", "p2")), st.sampled_from(NODES), st.integers(0, 1)),
    st.tuples(st.just("foreign gone"), st.sampled_from(("p1", "p2"))),
    st.tuples(st.just("hold claim gone"), st.sampled_from(NAMES)),
    st.tuples(st.just("hold claim deallocated"), st.sampled_from(NAMES)),
    st.tuples(st.just("slices"), st.sampled_from(NODES), st.integers(1, 3)),
)


def happen(harness: Harness, event: tuple[Any, ...]) -> None:
    world, what = harness.world, event[0]
    if what == "device":
        _, name, node, phase, count, vmi, class_name = event
        world.put(keys.GPUDEVICE_KIND, gpu_device(name, node if phase == "Bound" else None, count=count, phase=phase,
                                            vmi=vmi, class_name=class_name))
    elif what == "device gone":
        world.put(keys.GPUDEVICE_KIND, None, (NS, event[1]))
    elif what == "vmi":
        _, name, present = event
        obj = {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
               "spec": {}, "status": {}}
        world.put("VirtualMachineInstance", obj if present else None, (NS, name))
    elif what == "foreign":
        world.put(CLAIM, allocated_hold(event[1], event[2], event[3], namespace="default", owned=False))
    elif what == "foreign gone":
        world.put(CLAIM, None, ("default", event[1]))
    elif what in ("hold claim gone", "hold claim deallocated"):
        found = world.stores[CLAIM].get((NS, event[1]))
        if found is None:
            return
        after = None if what == "hold claim gone" else {**found, "status": {}}
        world.put(CLAIM, after, (NS, event[1]))
        harness.server.event(after, found)  # the claim informer's event
    elif what == "slices":
        world.put("ResourceSlice", dra_driver.resource_slice(event[1], f"uid-{event[1]}", event[2]))


async def settle(harness: Harness) -> None:
    """Passes until no key is queued (backoffs waited out), as the driver runs them."""
    for _ in range(20):
        await harness.run()
        harness.clock.advance(60)
        if not len(harness.work.queue):
            return
    raise AssertionError("the claims work never settled")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(EVENTS, max_size=6), min_size=1, max_size=5))
@example([[("foreign", "p1", "n1", 0), ("device", "d0", "n1", "Bound", 1, None, "dra")],  # short
          [("foreign gone", "p1")]])  # its node's unit freed: no event of the hold's own
@example([[("device", "d0", "n2", "Bound", 1, "vm1", "dra"), ("vmi", "vm1", True)],
          [("device", "d0", "n1", "Bound", 1, "vm1", "dra")],  # moved under its VM: kept (R-BIND-7)
          [("vmi", "vm1", False)]])  # the VM gone: moved now
@example([[("device", "d0", "n2", "Bound", 1, None, "dra"), ("device", "d1", "n2", "Bound", 2, None, "dra")],
          [("hold claim deallocated", "d0"), ("device", "d1", "n2", "Bound", 1, None, "dra")]])
def test_judging_the_devices_that_moved_leaves_what_planning_every_hold_leaves(
        rounds: list[list[tuple[Any, ...]]]) -> None:
    """Once the keyed work settles, the plan over every hold finds nothing to write (a short hold aside),
    and no two claims hold one device."""
    asyncio.run(_rounds(rounds))


async def _rounds(rounds: list[list[tuple[Any, ...]]]) -> None:
    world = dra_world({"n1": 1, "n2": 3})
    harness = Harness(world)
    for events in rounds:
        for event in events:
            happen(harness, event)
        await settle(harness)
        snapshot = world.live.snapshot(now=world.now, sources=world.sources())
        left = whole_fleet_plan(snapshot, world.live.dra)
        assert [s for s in left.steps if s.action is not ClaimAction.SHORT] == [], left
        assert left.release == ()
        holds = [view for obj in world.stores[CLAIM].values() if (view := resource_claim_view(obj)).is_hold]
        refs = [ref for view in holds for ref in view.allocated]
        assert len(refs) == len(set(refs)), "two hold claims hold one device"


@settings(max_examples=200, deadline=None)
@given(st.lists(EVENTS, max_size=12))
def test_one_device_planned_at_a_time_chooses_as_the_plan_over_every_hold(events: list[tuple[Any, ...]]) -> None:
    """With no set moving (a reallocation frees its units only once its deallocation is seen), the devices
    planned one by one in key order with one pass's choices plan what the whole-fleet plan does."""
    world = dra_world({"n1": 2, "n2": 3})
    harness = Harness(world)
    for event in events:
        happen(harness, event)
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    dra = world.live.dra
    whole = whole_fleet_plan(snapshot, dra)
    chosen: dict[DeviceRef, DeviceKey] = {}
    one_by_one = [device_plan(snapshot, dra, key, chosen) for key in keys_changed(snapshot, None, dra)]
    steps = tuple(step for plan in one_by_one for step in plan.steps)
    release = tuple(key for plan in one_by_one for key in plan.release)
    assert release == whole.release
    if all(step.action is not ClaimAction.REALLOCATE for step in whole.steps):
        assert steps == whole.steps
    mine = [ref for step in steps for ref in step.devices]
    assert len(mine) == len(set(mine))
    for step in steps:
        for ref in step.devices:
            holder = dra.first(ref)
            assert holder is None or (holder.namespace, holder.name) == step.device, "a unit another claim holds"
