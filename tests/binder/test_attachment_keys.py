"""The attachments work judges only the devices the change log names, each on its own, and decides what
judging every attachment decides.

The worlds are the LiveSnapshot property test's (random devices attached to
VMIs of the same or an old UID, VMIs started and stopped, launcher pods
Running or done, time passing, stores replaced), taken through the live
snapshot in rounds as the binder takes them. Each round feeds the work's
key queue as the work does (``AttachmentsWork.to_judge`` over the change
log, and the time each verdict asks to be judged again), judges the keys
ready one by one (``attachments.judge``), and the writes found must be the
plan over every attached device, detach for detach and adopt for adopt
(R-BIND-8).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.base.clock import FakeClock
from cozygpu.binder.attachments import Adopt, Detach, claimed_vmis, judge, plan_attachments
from cozygpu.binder.housekeeping import AttachmentsWork
from cozygpu.binder.reconciler import ChangeFeed
from cozygpu.model.snapshot import DeviceKey
from cozygpu.passes.keyed import KeyQueue
from tests.views.test_live_snapshot import (
    DEVICES,
    NAMESPACES,
    NODES,
    RESOURCES,
    VMIS,
    World,
    apply,
    device,
    seed,
    steps,
)

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


class Keyed:
    """The attachments work's key queue, fed and judged as the work does, on a clock kept with the world's."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.clock = FakeClock()
        self.at = world.now
        self.queue: KeyQueue[DeviceKey] = KeyQueue(self.clock)
        self.feed = ChangeFeed()
        self.first_seen: dict[DeviceKey, datetime] = {}

    def judge(self, skip: Sequence[DeviceKey] = ()) -> None:
        world = self.world
        # Passes are at least a first refusal's backoff apart; the queue's clock may run ahead of the world's.
        self.clock.advance(max((world.now - self.at).total_seconds(), 1.0))
        self.at = world.now
        snapshot = world.live.snapshot(now=world.now, sources=world.sources())
        self.queue.add_all(AttachmentsWork.to_judge(snapshot, self.feed.since(snapshot)))
        detaches: list[Detach] = []
        adopts: list[Adopt] = []
        claimed = functools.cache(functools.partial(claimed_vmis, snapshot))
        for key in self.queue.take():
            found = snapshot.devices.get(key)
            if found is None or found.attachment is None:
                self.first_seen.pop(key, None)
                continue
            if found.attachment.attached_at is None:
                self.first_seen.setdefault(key, snapshot.now)
            if key in skip:  # written by this pass already (its write refused): judged again after its backoff
                self.queue.retry(key)
                continue
            verdict = judge(snapshot, found, grace=GRACE, first_seen=self.first_seen.get(key), claimed=claimed)
            detaches += verdict.plan.detaches
            adopts += verdict.plan.adopts
            if verdict.plan.detaches or verdict.plan.adopts:
                self.queue.add(key)  # the world never takes the write: its event would come, and ask again
            elif verdict.again_in is not None:
                self.queue.add_after(key, verdict.again_in)
        whole = plan_attachments(snapshot, vmis_served=True, grace=GRACE, first_seen=self.first_seen, skip=skip)
        assert sorted(detaches, key=lambda d: d.device) == list(whole.detaches)
        assert sorted(adopts, key=lambda a: a.device) == list(whole.adopts)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(EVENTS, max_size=8), st.booleans()), min_size=1, max_size=6))
def test_judging_what_may_have_moved_decides_what_judging_every_attachment_decides(
        rounds: list[tuple[list[tuple[Any, ...]], bool]]) -> None:
    world = World()
    seed(world)
    keyed = Keyed(world)
    for events, skip_one in rounds:
        for step in events:
            happen(world, step)
        skip = [next(iter(sorted(keyed.first_seen)))] if skip_one and keyed.first_seen else []
        keyed.judge(skip)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ATTACHING, max_size=5), min_size=2, max_size=8))
def test_over_attachments_and_time_alone_judging_what_may_have_moved_decides_the_same(
        rounds: list[list[tuple[Any, ...]]]) -> None:
    world = World()
    seed(world)
    keyed = Keyed(world)
    for events in rounds:
        for step in events:
            happen(world, step)
        keyed.judge()


def test_a_device_whose_vmi_is_deleted_is_judged_again_with_no_event_of_its_own() -> None:
    world = World()
    seed(world)
    keyed = Keyed(world)
    apply(world, ("vmi", "vm1", "tenant-a", False, "n1"))  # no launcher: its deletion is an update, no rebuild
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", "vm1", True, False, False))
    keyed.judge()  # kept: its VMI is there, its UID known; nothing asks for it again
    assert ("tenant-a", "d0") not in keyed.queue
    happen(world, ("delete vmi", "vm1", "tenant-a"))
    snapshot = world.live.snapshot(now=world.now, sources=world.sources())
    assert ("tenant-a", "d0") in AttachmentsWork.to_judge(snapshot, keyed.feed.since(snapshot))


def test_an_attachment_waiting_for_its_vmi_is_judged_again_when_its_grace_ends() -> None:
    world = World()
    seed(world)
    keyed = Keyed(world)
    happen(world, ("attached unknown", "d0", "vm9"))
    keyed.judge()
    assert ("tenant-a", "d0") in keyed.queue  # for later
    assert keyed.queue.take() == []
    world.now += GRACE + timedelta(seconds=1)
    keyed.judge()  # the plan over everything detaches it: so must the key that came due


def test_a_device_kept_by_a_pod_claiming_its_gone_vmi_is_judged_again_when_that_pod_ends() -> None:
    """A VMI's launcher, torn down first, may be seen after the VMI's end: while a pod still claims the VMI the
    attachment stays. The pod ending is no event of the device's nor of a VMI's: the model logs a pod that
    claims a VMI as that VMI, so the device is judged again then."""
    world = World()
    seed(world)
    keyed = Keyed(world)
    apply(world, ("vmi", "vm1", "tenant-a", False, "n1"))
    apply(world, ("device", "d0", "tenant-a", "a", 1, "Bound", "n1", "vm1", True, False, False))
    apply(world, ("pod", "p3", "tenant-a", RESOURCES[0], 1, "n1", "Running", "vm1", True, 0))
    keyed.judge()
    happen(world, ("delete vmi", "vm1", "tenant-a"))
    keyed.judge()  # the VMI is gone, a pod still claims it: kept
    apply(world, ("pod", "p3", "tenant-a", RESOURCES[0], 1, "n1", "Succeeded", "vm1", True, 0))
    keyed.judge()  # the plan over everything clears it now: so must the key the pod's end queued
