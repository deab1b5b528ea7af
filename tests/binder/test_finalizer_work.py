"""The finalizers judged object by object, as their events ask, give what deciding over everything gives
(R-BIND-9).

Random sequences of device events (new, placed, lost, attached, detached,
deleting, gone), VMI events (started, gone, started again with another UID),
classes whose deletion begins, and finalizer runs whose writes land (each an
event back) or are refused; each run judges the keys the events queued
(``keys_of_device_event``; a VMI's deleting devices; a class) and those
whose backoff ended, and after every run the changes judged equal what
``class_finalizer_changes`` and ``device_finalizer_changes`` decide over every
device, VMI and class.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.base.clock import FakeClock
from cozygpu.binder.finalizers import (
    FinalizerChange,
    Key,
    class_finalizer_changes,
    class_key,
    device_finalizer_changes,
    device_key,
    holding,
    judge_class,
    judge_device,
    keys_of_device_event,
    vmi_uids,
)
from cozygpu.passes.keyed import KeyQueue
from tests.binder.test_finalizers import gpu_class, gpu_device

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
GRACE = timedelta(minutes=2)
NAMES = st.sampled_from(["a", "b", "c"])
VMIS = st.sampled_from(["vm1", "vm2"])
CLASSES = ("h100", "t4")
EVENTS = st.one_of(
    st.tuples(st.just("device"), NAMES, st.sampled_from([None, "Pending", "Bound", "Lost"]),
              st.sampled_from(CLASSES), st.one_of(st.none(), VMIS), st.booleans()),
    st.tuples(st.just("gone"), NAMES),
    st.tuples(st.just("vmi"), VMIS, st.sampled_from(["", "uid-1", "uid-2"])),
    st.tuples(st.just("run"), st.booleans()),
    st.tuples(st.just("class"), st.sampled_from(CLASSES)),
)


def key(change: FinalizerChange) -> tuple[Any, ...]:
    return (change.plural, change.namespace, change.name, change.finalizers)


class World:
    def __init__(self) -> None:
        self.classes = [gpu_class("h100", finalizers=(keys.CLASS_FINALIZER,)), gpu_class("t4")]
        self.devices: dict[str, dict[str, Any]] = {}
        self.vmis: dict[tuple[str, str], dict[str, Any]] = {}
        self.clock = FakeClock()
        self.queue: KeyQueue[Key] = KeyQueue(self.clock)
        self.queue.add_all(class_key(c["metadata"]["name"]) for c in self.classes)  # a term's start

    def put(self, name: str, new: dict[str, Any] | None) -> None:
        old = self.devices.get(name)
        if new is None:
            self.devices.pop(name, None)
        else:
            self.devices[name] = new
        self.queue.add_all(keys_of_device_event(old, new))

    def vmi(self, name: str, uid: str) -> None:
        if uid:
            self.vmis[("t", name)] = {"metadata": {"namespace": "t", "name": name, "uid": uid}}
        else:
            self.vmis.pop(("t", name), None)
        # As the work's VMI handler: the deleting devices attached to it.
        self.queue.add_all(device_key("t", d["metadata"]["name"]) for d in self.devices.values()
                           if d["status"].get("attachment", {}).get("vmi") == name
                           and d["metadata"].get("deletionTimestamp"))

    def begin_deleting(self, class_name: str) -> None:
        for found in self.classes:
            if found["metadata"]["name"] == class_name:
                found["metadata"]["deletionTimestamp"] = "2026-12-02T12:00:00Z"
                self.queue.add(class_key(class_name))

    def judge(self, key: Key) -> FinalizerChange | None:
        plural, _namespace, name = key
        if plural == keys.GPUDEVICE_PLURAL:
            device = self.devices.get(name)
            return judge_device(device, vmi_uids(self.vmis.values()), now=NOW, grace=GRACE).change \
                if device is not None else None
        [found] = [c for c in self.classes if c["metadata"]["name"] == name]
        return judge_class(found, holding(self.devices.values(), name)).change

    def run(self, refused: bool) -> None:
        self.clock.advance(60.0)  # past any first backoff
        expected = {key(c) for c in (*class_finalizer_changes(self.classes, self.devices.values()),
                                     *device_finalizer_changes(self.devices.values(), vmi_uids(self.vmis.values()),
                                                               now=NOW, grace=GRACE))}
        decided: list[tuple[Key, FinalizerChange]] = []
        for queued in self.queue.take():
            change = self.judge(queued)
            if change is not None:
                decided.append((queued, change))
        assert {key(c) for _, c in decided} == expected
        for queued, change in decided:
            if refused:
                self.queue.retry(queued)
                continue
            self.queue.forget(queued)
            if change.plural == keys.GPUCLASS_PLURAL:
                for found in self.classes:
                    if found["metadata"]["name"] == change.name:
                        found["metadata"]["finalizers"] = list(change.finalizers)
                        self.queue.add(class_key(change.name))  # its event
            elif change.name in self.devices:
                written = {**self.devices[change.name]}
                written["metadata"] = {**written["metadata"], "finalizers": list(change.finalizers)}
                if not change.finalizers and written["metadata"].get("deletionTimestamp"):
                    self.put(change.name, None)  # released: the API server deletes it
                else:
                    self.put(change.name, written)


@settings(max_examples=600, deadline=None)
@given(events=st.lists(EVENTS, max_size=80))
def test_what_changed_decides_what_everything_decides(events: list[tuple[Any, ...]]) -> None:
    world = World()
    for event in events:
        if event[0] == "device":
            _, name, phase, cls, vmi, deleting = event
            before = world.devices.get(name)
            finalizers = tuple(before["metadata"]["finalizers"]) if before is not None else ()
            deleting = deleting or bool(before and before["metadata"].get("deletionTimestamp"))
            world.put(name, gpu_device(name, cls=cls, phase=phase, vmi=vmi, finalizers=finalizers, deleting=deleting))
        elif event[0] == "gone":
            world.put(event[1], None)
        elif event[0] == "vmi":
            world.vmi(event[1], event[2])
        elif event[0] == "class":  # its deletion begins
            world.begin_deleting(event[1])
        else:
            world.run(event[1])
    world.run(False)


def test_a_deleting_device_kept_by_its_vmi_is_released_when_the_vmi_goes_with_no_event_of_its_own() -> None:
    world = World()
    world.vmi("vm1", "uid-1")
    world.put("a", gpu_device("a", phase="Bound", vmi="vm1"))
    world.run(False)  # a gets its finalizer
    world.put("a", gpu_device("a", phase="Bound", vmi="vm1", finalizers=(keys.DEVICE_FINALIZER,), deleting=True))
    world.run(False)  # kept: vm1 uses it
    assert "a" in world.devices
    world.vmi("vm1", "")
    world.run(False)  # vm1 is gone: released, and the API server deletes a
    assert "a" not in world.devices


def test_a_deleting_device_attached_before_its_vmi_is_seen_keeps_its_finalizer_for_the_grace() -> None:
    """The chaos test's race: a tenant deleted an idle hold while a VM start attached it (the VMI webhook
    attaches before the VMI exists). The replica's VMI watch did not show the VMI yet, the finalizer was
    released, and the device of a VM about to run was deleted."""
    attached = gpu_device("a", phase="Bound", vmi="vm1", finalizers=(keys.DEVICE_FINALIZER,), deleting=True)
    attached["status"]["attachment"]["attachedAt"] = "2026-12-02T12:00:00Z"
    kept = judge_device(attached, {}, now=NOW + timedelta(seconds=1), grace=GRACE)
    assert kept.change is None, "no VMI seen yet, within the grace: the VM may be starting with it"
    assert kept.again_in == (GRACE - timedelta(seconds=1)).total_seconds(), "looked at again when the grace ends"
    seen = judge_device(attached, {("t", "vm1"): "uid-1"}, now=NOW + timedelta(seconds=1), grace=GRACE)
    assert seen.change is None, "its VMI is there: in use"
    never = judge_device(attached, {}, now=NOW + GRACE, grace=GRACE)
    assert never.change is not None, "its VMI never came: released"
    assert not never.change.add
    recorded = gpu_device("a", phase="Bound", vmi="vm1", vmi_uid="uid-1", finalizers=(keys.DEVICE_FINALIZER,),
                          deleting=True)
    recorded["status"]["attachment"]["attachedAt"] = "2026-12-02T12:00:00Z"
    gone = judge_device(recorded, {}, now=NOW + timedelta(seconds=1), grace=GRACE)
    assert gone.change is not None, "its VMI was seen (its UID recorded) and is gone: released at once"
