"""A pass judges only the attachments whose verdict may have moved, and decides what judging all decides.

The worlds are the LiveSnapshot property test's (random devices attached to
VMIs of the same or an old UID, VMIs started and stopped, launcher pods
Running or done, time passing, stores replaced), taken through the live
snapshot in rounds as the binder takes them; each round's attachment plan
over ``AttachmentWatch``'s candidates must be the plan over every attached
device, detach for detach and adopt for adopt (R-BIND-8).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.binder.attachments import AttachmentWatch, attached_devices, plan_attachments
from cozygpu.model.snapshot import DeviceKey
from tests.views.test_live_snapshot import DEVICES, NAMESPACES, NODES, VMIS, World, apply, device, seed, steps

#: The live-snapshot test's events, and VMIs deleted.
DELETE_VMI = st.tuples(st.just("delete vmi"), st.sampled_from(VMIS), st.sampled_from(NAMESPACES[1:3]))
EVENTS = st.one_of(steps, DELETE_VMI)
#: Only what attachments turn on (most of the others rebuild the model, and a rebuild judges every one):
#: devices attached or not (to a VMI of a known UID, an old one, or one not known yet), VMIs started, stopped
#: and deleted, time.
ATTACHING = st.one_of(
    st.tuples(st.just("device"), st.sampled_from(DEVICES[:3]), st.just("tenant-a"), st.just("a"), st.just(1),
              st.sampled_from(("Pending", "Bound")), st.sampled_from((None, *NODES)),
              st.sampled_from((None, *VMIS)), st.booleans(), st.booleans(), st.just(False)),
    st.tuples(st.just("vmi"), st.sampled_from(VMIS), st.just("tenant-a"), st.booleans(),
              st.sampled_from((None, *NODES))),
    st.tuples(st.just("delete vmi"), st.sampled_from(VMIS), st.just("tenant-a")),
    st.tuples(st.just("attached unknown"), st.sampled_from(DEVICES[:3]), st.sampled_from(VMIS)),
    st.tuples(st.just("time"), st.integers(0, 2)),
)

GRACE = timedelta(minutes=2)


def happen(world: World, step: tuple[Any, ...]) -> None:
    if step[0] == "delete vmi":
        world.put("VirtualMachineInstance", None, (step[2], step[1]))
    elif step[0] == "attached unknown":  # as the VMI webhook attaches: the VMI's UID not known yet
        world.put(keys.GPUDEVICE_KIND, device(step[1], "tenant-a", class_name="a", count=1, phase="Bound",
                                              node_name="n1", vmi=step[2], uid="", deleting=False, request=None))
    elif step[0] != "check":
        apply(world, step)


def judge(world: World, watch: AttachmentWatch, first_seen: dict[DeviceKey, datetime],
          skip: Sequence[DeviceKey] = ()) -> None:
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    judged = attached_devices(snapshot, watch.candidates(snapshot))
    for attached in judged:
        first_seen.setdefault(attached.key, snapshot.now)
    whole = plan_attachments(snapshot, vmis_served=True, grace=GRACE, first_seen=first_seen, skip=skip)
    plan = plan_attachments(snapshot, vmis_served=True, grace=GRACE, first_seen=first_seen, skip=skip,
                            attached=judged)
    assert plan == whole
    watch.judged(snapshot, judged, plan, skip, clean=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(EVENTS, max_size=8), st.booleans()), min_size=1, max_size=6))
def test_judging_what_may_have_moved_decides_what_judging_every_attachment_decides(
        rounds: list[tuple[list[tuple[Any, ...]], bool]]) -> None:
    world = World()
    seed(world)
    watch = AttachmentWatch()
    first_seen: dict[DeviceKey, datetime] = {}
    for events, skip_one in rounds:
        for step in events:
            happen(world, step)
        skip = [next(iter(sorted(first_seen)))] if skip_one and first_seen else []
        judge(world, watch, first_seen, skip)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ATTACHING, max_size=5), min_size=2, max_size=8))
def test_over_attachments_and_time_alone_judging_what_may_have_moved_decides_the_same(
        rounds: list[list[tuple[Any, ...]]]) -> None:
    world = World()
    seed(world)
    watch = AttachmentWatch()
    first_seen: dict[DeviceKey, datetime] = {}
    for events in rounds:
        for step in events:
            happen(world, step)
        judge(world, watch, first_seen)


def test_a_device_whose_vmi_is_deleted_is_judged_again_with_no_event_of_its_own() -> None:
    world = World()
    seed(world)
    watch = AttachmentWatch()
    first_seen: dict[DeviceKey, datetime] = {}
    apply(world, ("vmi", "vm1", "tenant-a", False, "n1"))  # no launcher: its deletion is an update, no rebuild
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", "vm1", True, False, False))
    judge(world, watch, first_seen)  # settled: its VMI is there, its UID known
    happen(world, ("delete vmi", "vm1", "tenant-a"))
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    candidates = watch.candidates(snapshot)
    assert candidates is not None
    assert ("tenant-a", "d0") in candidates
    judge(world, watch, first_seen)
