"""A GPUDevice read through the floor, and the status patches placement builds from it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cozygpu.api import apistatus, classes, devices, events
from cozygpu.api.devices import BindAnswer, Placement

T0 = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def device(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "d1", "namespace": "t"}, "spec": {"className": "h100", "count": 2},
            "status": status}


def test_a_malformed_device_reads_as_empty_without_raising() -> None:
    broken = {"spec": {"className": 7, "count": True}, "status": {"phase": 1, "bindRequest": "r-1",
                                                                  "bindAnswer": ["x"], "attachment": None,
                                                                  "conditions": "no"}}
    for obj in (broken, None, {}):
        assert devices.phase(obj) == ""
        assert devices.class_name(obj) == ""
        assert devices.count(obj) is None
        assert devices.bind_request_id(obj) == ""
        assert devices.bind_answer_id(obj) == ""
        assert devices.attachment_vmi(obj) == ""
        assert devices.condition_status(obj, "Bound") == ""
        assert devices.unanswered(obj) == ""
        assert not devices.holds(obj)


def test_what_a_device_says() -> None:
    obj = device(phase="Lost", nodeName="n1", attachment={"vmi": "vm", "uid": "u1"},
                 conditions=[{"type": "AttachmentVerified", "status": "False"}])
    assert (devices.phase(obj), devices.node_name(obj), devices.class_name(obj), devices.count(obj)) == (
        "Lost", "n1", "h100", 2)
    assert devices.holds(obj)
    assert not devices.bound(obj)
    assert (devices.attachment_vmi(obj), devices.attachment_uid(obj)) == ("vm", "u1")
    assert devices.condition_status(obj, "AttachmentVerified") == "False"
    assert devices.condition_status(obj, "Bound") == ""


def test_a_request_is_unanswered_until_an_answer_names_it() -> None:
    asking = device(bindRequest={"id": "r-2"}, bindAnswer={"id": "r-1", "result": "Succeeded"})
    assert devices.unanswered(asking) == "r-2"
    assert devices.answer_result(asking) == "Succeeded"
    assert devices.unanswered(device(bindRequest={"id": "r-2"}, bindAnswer={"id": "r-2"})) == ""
    assert devices.unanswered(device(bindRequest={"id": "r-3"})) == "r-3"


def test_a_new_order_is_pending_or_phaseless_and_unanswered() -> None:
    assert devices.new_order(device())
    assert devices.new_order(device(phase="Pending"))
    assert not devices.new_order(device(phase="Bound"))
    assert not devices.new_order(device(phase="Pending", bindAnswer={"id": "r-1"}))


def test_a_placement_says_whether_it_moves_the_device() -> None:
    bound = device(phase="Bound", nodeName="n1")
    assert not Placement.bound("n1").moves(bound)
    assert Placement.bound("n2").moves(bound)
    assert Placement.lost().moves(bound)
    assert not Placement.lost().moves(device(phase="Lost"))
    assert Placement.pending().moves(bound)
    assert not Placement.pending().moves(device(phase="Pending", nodeName="n1")), "Pending leaves the node"
    assert Placement.lost().fields() == {"phase": "Lost", "nodeName": None}
    assert Placement.pending().fields() == {"phase": "Pending"}


def test_an_answer_is_given_when_the_device_says_the_same_but_for_its_time() -> None:
    answer = BindAnswer(id="r-1", result="Succeeded", reason="Bound", message="held", node="n1", time=T0)
    assert answer.as_json() == {"id": "r-1", "result": "Succeeded", "reason": "Bound", "message": "held",
                                "node": "n1", "time": "2026-12-05T12:00:00Z"}
    assert answer.given(device(bindAnswer={**answer.as_json(), "time": "2020-01-01T00:00:00Z"}))
    assert not answer.given(device(bindAnswer={**answer.as_json(), "node": "n2"}))
    assert not answer.given(device())


def test_a_status_patch_names_only_what_the_decision_writes() -> None:
    answer = BindAnswer(id="r-1", result="Succeeded", reason="Bound", message="held", node="n1", time=T0)
    assert devices.status_patch() == {}
    assert devices.status_patch(placement=Placement.bound("n1"), conditions=[{"type": "Bound"}], answer=answer,
                                generation=3) == {
        "phase": "Bound", "nodeName": "n1", "conditions": [{"type": "Bound"}], "bindAnswer": answer.as_json(),
        "observedGeneration": 3}


def test_a_class_resource_name_and_a_status_cause() -> None:
    assert classes.resource_name({"spec": {"resourceName": "nvidia.com/x"}}) == "nvidia.com/x"
    assert classes.resource_name({"spec": None}) == ""
    assert apistatus.cause_kinds([{"type": "NamespaceTerminating"}, {"reason": "Other"}, "junk"]) == {
        "NamespaceTerminating", "Other"}
    assert apistatus.cause_kinds(None) == frozenset()


def test_an_event_body_names_its_object_at_a_version() -> None:
    involved = events.Involved(api_version="gpu.cozystack.io/v1alpha1", kind="GPUDevice", namespace="t", name="d1",
                               uid="u1", resource_version="42")
    event = events.Event(name="d1.abc", involved=involved, type="Normal", reason="Bound", message="x" * 2000,
                         component="cozygpu-binder", instance="r0", time=T0)
    body = event.as_json()
    assert event.namespace == "t"
    assert body["metadata"] == {"namespace": "t", "name": "d1.abc"}
    assert body["involvedObject"] == {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice",
                                      "namespace": "t", "name": "d1", "uid": "u1", "resourceVersion": "42"}
    assert len(body["message"]) == events.MESSAGE_LIMIT
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-12-05T12:00:00Z"
