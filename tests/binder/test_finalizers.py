"""When the class and device finalizers are added and released (pure, R-BIND-9)."""

from __future__ import annotations

from typing import Any

from cozygpu import keys
from cozygpu.binder.finalizers import class_finalizer_changes, device_finalizer_changes, vmi_uids


def gpu_class(name: str, *, finalizers: tuple[str, ...] = (), deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": "5", "finalizers": list(finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T12:00:00Z"
    return {"metadata": meta}


def gpu_device(name: str, *, cls: str = "h100", phase: str | None = None, vmi: str | None = None,
               vmi_uid: str = "", finalizers: tuple[str, ...] = (), deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "t", "resourceVersion": "9", "finalizers": list(finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T12:00:00Z"
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if vmi:
        status["attachment"] = {"vmi": vmi, "uid": vmi_uid}
    return {"metadata": meta, "spec": {"className": cls, "count": 1}, "status": status}


PROTECTED = (keys.CLASS_FINALIZER,)
KEPT = (keys.DEVICE_FINALIZER,)


def test_every_class_gets_the_finalizer_next_to_the_ones_it_has() -> None:
    (change,) = class_finalizer_changes([gpu_class("h100", finalizers=("other",))], [])
    assert change.add
    assert change.finalizers == ("other", keys.CLASS_FINALIZER)
    assert change.resource_version == "5"
    assert class_finalizer_changes([gpu_class("h100", finalizers=PROTECTED)], []) == ()


def test_a_deleting_class_is_released_only_when_no_device_holds_it() -> None:
    deleting = gpu_class("h100", finalizers=PROTECTED, deleting=True)
    for phase in ("Bound", "Lost"):
        assert class_finalizer_changes([deleting], [gpu_device("d", phase=phase)]) == ()
    (change,) = class_finalizer_changes([deleting], [gpu_device("d"), gpu_device("e", cls="t4", phase="Bound")])
    assert not change.add
    assert change.finalizers == ()


def test_a_class_being_deleted_never_gets_the_finalizer_added() -> None:
    assert class_finalizer_changes([gpu_class("h100", deleting=True)], [gpu_device("d", phase="Bound")]) == ()


def test_every_device_gets_the_finalizer() -> None:
    (change,) = device_finalizer_changes([gpu_device("d")], {})
    assert change.add
    assert change.finalizers == KEPT


def test_a_deleting_device_stays_while_its_vmi_exists() -> None:
    device = gpu_device("d", vmi="vm", vmi_uid="u1", finalizers=KEPT, deleting=True)
    vmis = vmi_uids([{"metadata": {"namespace": "t", "name": "vm", "uid": "u1"}}])
    assert device_finalizer_changes([device], vmis) == ()


def test_a_deleting_device_is_released_when_its_vmi_is_gone_or_another_with_its_name_runs() -> None:
    device = gpu_device("d", vmi="vm", vmi_uid="u1", finalizers=KEPT, deleting=True)
    other = vmi_uids([{"metadata": {"namespace": "t", "name": "vm", "uid": "u2"}}])
    for vmis in ({}, other):
        (change,) = device_finalizer_changes([device], vmis)
        assert not change.add


def test_a_deleting_unattached_device_is_released() -> None:
    (change,) = device_finalizer_changes([gpu_device("d", phase="Bound", finalizers=KEPT, deleting=True)], {})
    assert not change.add


def test_while_the_vmi_kind_is_not_served_an_attached_device_keeps_its_finalizer() -> None:
    device = gpu_device("d", vmi="vm", finalizers=KEPT, deleting=True)
    assert device_finalizer_changes([device], None) == ()
