"""The claims work's pure parts: which claim events ask for a pass, and what a plan writes (SPEC §1.5)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cozygpu.api import claims as claims_api
from cozygpu.binder.binder import _claim_worth_a_pass
from cozygpu.binder.claims import claims_plan
from cozygpu.cache.frozen import FrozenDict, freeze
from cozygpu.cache.store import Event
from cozygpu.devcluster import dra_driver
from cozygpu.model.dra import DeviceRef, DraTracker
from cozygpu.model.snapshot import Phase
from cozygpu.views.decode import gpu_class_view, resource_claim_view, resource_slice_view
from cozygpu.views.live import build_snapshot
from tests.model.factories import NOW

NOW_WALL = datetime(2026, 12, 6, tzinfo=UTC)
IMPLICIT = f"deviceclass.resource.kubernetes.io/{dra_driver.DEVICE_CLASS}"


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


def device(name: str, phase: str, node: str | None, *, vmi: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if node:
        status["nodeName"] = node
    if vmi:
        status["attachment"] = {"vmi": vmi, "vmiUID": f"uid-{vmi}"}
    return {"metadata": {"name": name, "namespace": "tenant-a", "uid": f"uid-{name}", "resourceVersion": "1"},
            "spec": {"className": "dra", "count": 1}, "status": status}


def test_a_hold_claim_whose_device_holds_nothing_is_released_unless_a_vm_it_is_attached_to_exists() -> None:
    dra_class = {"metadata": {"name": "dra"}, "spec": {"mode": "Passthrough", "resourceName": IMPLICIT, "source": {
        "dra": {"deviceClassName": dra_driver.DEVICE_CLASS}}}}
    slices = [dra_driver.resource_slice("n1", "uid-n1", 2)]
    claims = [hold("gone", node="n1"), hold("unbound", node="n1"), hold("running", node="n1"),
              hold("expired", node="n1")]
    devices = [device("unbound", "Pending", None), device("running", "Lost", "n1", vmi="vm"),
               device("expired", "Released", None)]  # its idle hold released (R-LEDGER-2)
    vmi = {"metadata": {"name": "vm", "namespace": "tenant-a", "uid": "uid-vm"}, "status": {}}
    snapshot = build_snapshot(now=NOW, classes=[dra_class], devices=devices, vmis=[vmi], slices=slices,
                              device_classes=[dra_driver.device_class()], claims=claims)
    assert snapshot.devices[("tenant-a", "running")].phase is Phase.LOST
    tracker = DraTracker([gpu_class_view(dra_class)], [resource_slice_view(s) for s in slices],
                         {dra_driver.DEVICE_CLASS: ("true",)}, [resource_claim_view(c) for c in claims])
    plan = claims_plan(snapshot, tracker)
    assert plan.release == (("tenant-a", "expired"), ("tenant-a", "gone"), ("tenant-a", "unbound")), \
        "a Lost device's claim stays while its VM exists: the launcher runs on it (R-BIND-7)"
    assert plan.steps == ()
