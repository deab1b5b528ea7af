"""The finalizers decided from what changed give what deciding over everything gives (R-BIND-9).

Random sequences of device events (new, placed, lost, attached, detached,
deleting, gone), VMI events (started, gone, started again with another UID),
classes whose deletion begins, and finalizer runs whose writes land (each an event back) or are refused;
after every run, what ``FinalizerWork`` decided from the events equals what
``class_finalizer_changes`` and ``device_finalizer_changes`` decide over every
device, VMI and class.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.binder.finalizers import (
    FinalizerChange,
    FinalizerWork,
    VmiUids,
    class_finalizer_changes,
    device_finalizer_changes,
    vmi_uids,
)
from tests.binder.test_finalizers import gpu_class, gpu_device

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
        self.work = FinalizerWork()

    def put(self, name: str, new: dict[str, Any] | None) -> None:
        old = self.devices.get(name)
        if new is None:
            self.devices.pop(name, None)
        else:
            self.devices[name] = new
        self.work.device(old, new)

    def vmi(self, name: str, uid: str) -> None:
        if uid:
            self.vmis[("t", name)] = {"metadata": {"namespace": "t", "name": name, "uid": uid}}
        else:
            self.vmis.pop(("t", name), None)
        self.work.vmi()

    def run(self, refused: bool) -> None:
        expected = {key(c) for c in (*class_finalizer_changes(self.classes, self.devices.values()),
                                     *device_finalizer_changes(self.devices.values(), vmi_uids(self.vmis.values())))}
        uids = VmiUids(lambda namespace, name: self.vmis.get((namespace, name)), lambda: list(self.vmis.values()))
        decided = self.work.changes(self.classes, lambda: list(self.devices.values()),
                                    lambda _namespace, name: self.devices.get(name), uids)
        assert {key(c) for c in decided} == expected
        for change in decided:
            if refused:
                continue
            if change.plural == keys.GPUCLASS_PLURAL:
                for gpu_class in self.classes:
                    if gpu_class["metadata"]["name"] == change.name:
                        gpu_class["metadata"]["finalizers"] = list(change.finalizers)
            elif change.name in self.devices:
                written = {**self.devices[change.name]}
                written["metadata"] = {**written["metadata"], "finalizers": list(change.finalizers)}
                if not change.finalizers and written["metadata"].get("deletionTimestamp"):
                    self.put(change.name, None)  # released: the API server deletes it
                else:
                    self.put(change.name, written)
        self.work.done(stale=refused and bool(decided))


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
        elif event[0] == "class":  # its deletion begins (the binder reads classes whole, every run)
            for gpu_class in world.classes:
                if gpu_class["metadata"]["name"] == event[1]:
                    gpu_class["metadata"]["deletionTimestamp"] = "2026-12-02T12:00:00Z"
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


def test_the_held_count_is_the_caches_so_the_echo_of_an_assumed_bind_is_counted_once() -> None:
    """The count starts from the cache's devices and follows its events: a write the binder assumed is held
    for this run only, and its echo counts it once, so the class's finalizer goes with the last holder."""
    cached = {"a": gpu_device("a", finalizers=(keys.DEVICE_FINALIZER,))}
    bound = gpu_device("a", phase="Bound", finalizers=(keys.DEVICE_FINALIZER,))
    classes = [gpu_class("h100", finalizers=(keys.CLASS_FINALIZER,), deleting=True)]
    work = FinalizerWork()

    def decide(assumed: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
        changes = work.changes(classes, lambda: list(cached.values()),
                               lambda _namespace, name: bound if assumed else cached.get(name), None,
                               assumed=assumed)
        work.done(stale=False)
        return {key(c) for c in changes}

    assert decide([bound]) == set(), "the assumed bind holds the class"
    work.device(cached["a"], bound)  # the echo
    cached["a"] = bound
    assert decide([]) == set()
    work.device(bound, None)  # the device is gone
    del cached["a"]
    assert decide([]) == {(keys.GPUCLASS_PLURAL, None, "h100", ())}, "the last holder gone: the class is released"
