"""Which attachments a pass clears and which template devices it deletes (R-BIND-7, R-BIND-8)."""

from __future__ import annotations

from datetime import timedelta

import attrs

from cozygpu.binder.attachments import (
    VMI_GONE,
    VMI_NEVER_APPEARED,
    AttachmentsUnverified,
    Detach,
    plan_attachments,
)
from cozygpu.model.snapshot import Attachment, DeviceView, Phase, PodPhase
from tests.model.factories import NOW, device, pod, snapshot, vmi

GRACE = timedelta(minutes=2)


def attached(name: str, vmi_name: str, *, uid: str = "", at_ago: timedelta | None = None,
             template: bool = False, deleting: bool = False) -> DeviceView:
    base = device(name, phase=Phase.BOUND, node="n1")
    at = NOW - at_ago if at_ago is not None else None
    return attrs.evolve(base, attachment=Attachment(vmi=vmi_name, uid=uid, attached_at=at), template=template,
                        deleting=deleting)


def test_an_attachment_whose_vmi_exists_is_kept() -> None:
    snap = snapshot(devices=[attached("d1", "vm1", uid="u1", at_ago=timedelta(hours=1))], vmis=[vmi("vm1", uid="u1")])

    assert plan_attachments(snap, vmis_served=True, grace=GRACE).detaches == ()


def test_an_attachment_whose_vmi_is_gone_is_cleared_and_the_hold_stays() -> None:
    snap = snapshot(devices=[attached("d1", "vm1", uid="u1", at_ago=timedelta(seconds=5))])

    plan = plan_attachments(snap, vmis_served=True, grace=GRACE)

    assert plan.detaches == (Detach(device=("tenant-a", "d1"), vmi="vm1", reason=VMI_GONE, delete=False),)
    assert "the hold stays" in plan.detaches[0].message


def test_a_vmi_of_the_same_name_but_another_uid_is_another_vm_the_attachment_is_cleared() -> None:
    snap = snapshot(devices=[attached("d1", "vm1", uid="u1", at_ago=timedelta(seconds=5))],
                    vmis=[vmi("vm1", uid="u2")])

    assert [d.reason for d in plan_attachments(snap, vmis_served=True, grace=GRACE).detaches] == [VMI_GONE]


def test_an_attachment_waits_the_grace_for_its_vmi_to_appear_then_is_cleared() -> None:
    young = attached("young", "vm-young", at_ago=GRACE - timedelta(seconds=1))
    old = attached("old", "vm-old", at_ago=GRACE)

    plan = plan_attachments(snapshot(devices=[young, old]), vmis_served=True, grace=GRACE)

    assert plan.detaches == (Detach(device=("tenant-a", "old"), vmi="vm-old", reason=VMI_NEVER_APPEARED,
                                    delete=False),)


def test_an_attachment_without_a_time_waits_a_grace_from_when_the_binder_first_saw_it() -> None:
    snap = snapshot(devices=[attached("d1", "vm1")])

    assert plan_attachments(snap, vmis_served=True, grace=GRACE).detaches == ()
    seen_long_ago = {("tenant-a", "d1"): NOW - GRACE}
    assert [d.reason for d in plan_attachments(snap, vmis_served=True, grace=GRACE,
                                               first_seen=seen_long_ago).detaches] == [VMI_NEVER_APPEARED]


def test_a_running_launcher_keeps_the_attachment_even_when_the_recorded_uid_differs() -> None:
    # The VMI's activePods name a Running pod: whatever else is odd, a running VM keeps its device.
    snap = snapshot(devices=[attached("d1", "vm1", uid="stale", at_ago=timedelta(hours=1))],
                    vmis=[vmi("vm1", uid="u2", active=["pod-uid"])],
                    pods=[pod("virt-launcher-vm1-abcde", uid="pod-uid", phase=PodPhase.RUNNING)])

    assert plan_attachments(snap, vmis_served=True, grace=GRACE).detaches == ()


def test_a_template_device_is_deleted_where_another_would_be_cleared() -> None:
    snap = snapshot(devices=[attached("tpl", "vm1", uid="u1", at_ago=timedelta(seconds=5), template=True),
                             attached("kept", "vm2", uid="u2", template=True)],
                    vmis=[vmi("vm2", uid="u2")])

    assert plan_attachments(snap, vmis_served=True, grace=GRACE).detaches == (
        Detach(device=("tenant-a", "tpl"), vmi="vm1", reason=VMI_GONE, delete=True),)


def test_devices_being_deleted_and_devices_written_this_pass_are_left_alone() -> None:
    snap = snapshot(devices=[attached("deleting", "vm1", uid="u1", deleting=True),
                             attached("written", "vm2", uid="u2")])

    plan = plan_attachments(snap, vmis_served=True, grace=GRACE, skip=[("tenant-a", "written")])

    assert plan.detaches == ()


def test_while_the_vmi_kind_is_not_served_nothing_is_detached_and_every_attached_device_is_unverified() -> None:
    snap = snapshot(devices=[attached("d1", "vm1", uid="u1"), attached("d2", "vm2", at_ago=timedelta(hours=1)),
                             device("free", phase=Phase.BOUND, node="n1")])

    plan = plan_attachments(snap, vmis_served=False, grace=GRACE)

    assert plan.detaches == ()
    assert plan.unverified == (("tenant-a", "d1"), ("tenant-a", "d2"))
    message = str(AttachmentsUnverified(plan.unverified))
    assert "2 GPUDevice(s) attached (tenant-a/d1, tenant-a/d2)" in message
    assert "virtualmachineinstances.kubevirt.io is not served" in message


def test_an_attachment_whose_vmi_is_gone_waits_while_a_pod_still_claims_that_vmi() -> None:
    """A replica may see the VMI's end before its launcher's (each watch reconnects on its own): the attachment
    stays while a pod not finished claims that VMI (name and UID), and is cleared once none does."""
    gone = attached("d1", "vm1", uid="u1", at_ago=timedelta(seconds=5))
    launcher = pod("virt-launcher-vm1", node_name="n1", claims_vmi=("vm1", "u1"))
    assert plan_attachments(snapshot(devices=[gone], pods=[launcher]), vmis_served=True, grace=GRACE).detaches == ()
    for pods in ([], [attrs.evolve(launcher, phase=PodPhase.SUCCEEDED)],
                 [attrs.evolve(launcher, claims_vmi=("vm1", "u-earlier"))]):
        plan = plan_attachments(snapshot(devices=[gone], pods=pods), vmis_served=True, grace=GRACE)
        assert [d.reason for d in plan.detaches] == [VMI_GONE], pods
