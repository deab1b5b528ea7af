"""The API floor's admission readers: an AdmissionReview, a VMI, a launcher pod, a GPUDevice, a Lease.

Each reads a well-formed object as the webhooks need it, reads a malformed
one as empty without raising, and returns a list as sent (not copied, not
walked), so a webhook can compare its length with a bound before it reads
an entry.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cozygpu import keys
from cozygpu.api import admission, admission_devices, device_refs, kubevirt, leases, meta, pods, scheduling, values
from cozygpu.model.snapshot import Attachment, BindAnswer

T0 = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def test_a_review_request_is_read_once_into_its_typed_fields() -> None:
    obj = {"metadata": {"name": "vm"}}
    old = {"metadata": {"name": "vm", "resourceVersion": "3"}}
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "operation": "UPDATE", "namespace": "tenant-a", "name": "vm", "kind": {"kind": "X"},
        "object": obj, "oldObject": old, "dryRun": True, "userInfo": {"username": "someone"}}}
    head = admission.review(body)
    assert head.is_v1
    assert head.request is not None
    request = admission.admission_request(head.request)
    assert request == admission.AdmissionRequest(uid="u-1", operation="UPDATE", namespace="tenant-a", name="vm",
                                                 object=obj, old_object=old, dry_run=True, kind="X",
                                                 user="someone")
    assert request.object is obj  # not copied


def test_a_malformed_review_reads_as_empty_and_its_type_as_sent() -> None:
    head = admission.review({"apiVersion": 7, "kind": ["AdmissionReview"], "request": "x"})
    assert not head.is_v1
    assert (head.api_version, head.kind, head.request) == (7, ["AdmissionReview"], None)
    raw: dict[str, Any] = {"uid": 5, "object": [], "dryRun": "true", "kind": "X", "userInfo": None}
    assert admission.request_uid(raw) == ""
    assert admission.request_object(raw) is None
    request = admission.admission_request(raw)
    assert (request.uid, request.dry_run, request.kind, request.user, request.old_object) == ("", False, "", "", None)
    assert request.object == {}


def test_a_response_carries_a_refusal_status_or_an_allowed_patch_and_warning() -> None:
    refused = admission.response("u-1", allowed=False, code=403, reason="BudgetExceeded", message="no")
    assert refused == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
        "uid": "u-1", "allowed": False, "status": {"code": 403, "reason": "BudgetExceeded", "message": "no"}}}
    allowed = admission.response("u-2", allowed=True, warning="w", patch="W10=")
    assert allowed["response"] == {"uid": "u-2", "allowed": True, "warnings": ["w"], "patchType": "JSONPatch",
                                   "patch": "W10="}
    assert admission.response("u-3", allowed=True)["response"] == {"uid": "u-3", "allowed": True}


def _vmi(devices: object = None, **spec: object) -> dict[str, Any]:
    domain: dict[str, Any] = {"resources": {"requests": {"nvidia.com/X": "1"}, "limits": "junk"}}
    if devices is not None:
        domain["devices"] = devices
    return {"metadata": {"name": "vm", "annotations": {keys.DEVICE_REFS_ANNOTATION: "[]", "other": 5}},
            "spec": {"domain": domain, **spec}}


def test_a_vmi_domain_reads_its_gpu_and_host_device_entries_and_resources() -> None:
    gpus = [{"name": "g0", "deviceName": "nvidia.com/X"}, {"name": 5, "claimName": "c"}, "junk"]
    vmi = _vmi({"gpus": gpus, "hostDevices": [{"name": "h", "deviceName": "nvidia.com/Y"}]})
    assert kubevirt.device_refs(vmi) == "[]"
    domain = kubevirt.domain(vmi)
    assert (domain.present, domain.has_devices) == (True, True)
    assert domain.gpus is gpus  # as sent: its length is free, nothing walked
    assert [kubevirt.gpu(e) for e in gpus] == [kubevirt.GPU("g0", "nvidia.com/X"), kubevirt.GPU("", "", "c"),
                                               kubevirt.GPU("", "")]
    assert kubevirt.GPU("g0", "nvidia.com/X", "c").as_json() == {"name": "g0", "deviceName": "nvidia.com/X"}
    assert [kubevirt.host_device(e) for e in domain.host_devices] == [kubevirt.HostDevice("h", "nvidia.com/Y")]
    assert domain.requests == {"nvidia.com/X": "1"}
    assert domain.limits == {}


def test_a_vmi_without_domain_devices_or_gpus_list_reads_as_absent_where_a_patch_must_create_it() -> None:
    assert not kubevirt.domain({"spec": {"domain": "x"}}).present
    assert not kubevirt.domain({}).present
    assert not kubevirt.domain(_vmi()).has_devices
    assert kubevirt.domain(_vmi({})).has_devices
    assert kubevirt.domain(_vmi({})).gpus is None
    assert kubevirt.domain(_vmi({"gpus": {"a": 1}})).gpus is None
    assert kubevirt.domain(_vmi({"hostDevices": "x"})).host_devices == ()
    assert kubevirt.device_refs({"metadata": {"annotations": {keys.DEVICE_REFS_ANNOTATION: ["x"]}}}) is None
    assert kubevirt.device_refs({"metadata": "x"}) is None


def test_scheduling_fields_are_read_from_a_spec_as_sent() -> None:
    terms = [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["a", "b"]}]}, "junk"]
    spec = {"tolerations": [{"operator": "Exists"}], "nodeSelector": {"a": "b"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": terms}}}}
    assert scheduling.required_terms(spec) is terms
    assert scheduling.tolerations(spec) == [{"operator": "Exists"}]
    assert scheduling.node_selector(spec) == {"a": "b"}
    assert [len(scheduling.match_expressions(t)) for t in terms] == [1, 0]
    assert scheduling.requirement_values(scheduling.match_expressions(terms[0])[0]) == ["a", "b"]
    assert scheduling.match_fields("junk") == ()
    assert scheduling.tolerations_or_none({"tolerations": "x"}) is None
    assert scheduling.affinity({}) is None
    assert scheduling.node_affinity({"affinity": {}}) is None
    assert scheduling.required_terms({"affinity": {"nodeAffinity": []}}) == ()


def test_a_term_gets_a_match_field_in_a_copy() -> None:
    term = {"matchExpressions": [{"key": "k"}], "matchFields": [{"key": "a"}]}
    requirement = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    assert scheduling.with_match_field(term, requirement) == {"matchExpressions": [{"key": "k"}],
                                                              "matchFields": [{"key": "a"}, requirement]}
    assert term["matchFields"] == [{"key": "a"}]
    assert scheduling.with_match_field("junk", requirement) == {"matchFields": [requirement]}


def test_a_launcher_pods_vmi_owner_is_its_controller_reference_to_a_kubevirt_vmi() -> None:
    vmi_owner = {"kind": "VirtualMachineInstance", "apiVersion": "kubevirt.io/v1", "name": "vm", "uid": "u",
                 "controller": True}
    owners = [{**vmi_owner, "controller": False}, {**vmi_owner, "apiVersion": "other.io/v1"}, "junk", vmi_owner]
    pod = {"metadata": {"ownerReferences": owners}}
    assert pods.owners(pod) is owners
    assert pods.vmi_owner(pods.owners(pod)) == ("vm", "u")
    assert pods.vmi_owner(owners[:3]) is None
    assert pods.owners({"metadata": {"ownerReferences": {"a": 1}}}) == ()
    assert pods.vmi_owner([{**vmi_owner, "name": 5}]) == ("", "u")


def test_a_device_refs_entry_is_read_as_written() -> None:
    entry = device_refs.entry({"template": "t", "class": 5, "extra": None})
    assert entry == device_refs.Entry(fields=frozenset({"template", "class", "extra"}), device=None, template="t",
                                      class_name=5, count=None)
    assert entry.fields - device_refs.TEMPLATE_FIELDS == {"extra"}
    assert device_refs.entry({"device": "d"}).fields == device_refs.DEVICE_FIELDS


def test_a_gpudevice_order_is_a_class_name_and_an_integer_count() -> None:
    assert admission_devices.order({"spec": {"className": "h100", "count": 2}}) == admission_devices.Order("h100", 2)
    for spec in ({"className": "h100", "count": True}, {"className": "", "count": 1}, {"count": 1},
                 {"className": "h100", "count": 1.0}):
        assert admission_devices.order({"spec": spec}) is None, spec
    assert admission_devices.order({"spec": "x"}) is None


def test_a_gpudevice_finalizers_read_as_sent_or_none() -> None:
    finalizers = ["a", 5]
    assert admission_devices.finalizer_list({"metadata": {"finalizers": finalizers}}) is finalizers
    assert admission_devices.finalizer_list({"metadata": {"finalizers": "a"}}) is None
    assert admission_devices.finalizer_list({}) is None


def test_a_gpudevice_bind_handshake_reads_typed() -> None:
    device = {"status": {
        "attachment": {"vmi": "vm", "uid": 5, "attachedAt": "2026-12-05T12:00:00Z", "requestId": "r"},
        "bindAnswer": {"id": "r", "result": "Succeeded", "node": "n1", "reason": None, "time": "soon"}}}
    assert admission_devices.attachment(device) == Attachment(vmi="vm", uid="", attached_at=T0, request_id="r")
    assert admission_devices.bind_answer(device) == BindAnswer(id="r", result="Succeeded", node="n1")
    assert admission_devices.attachment({"status": {"attachment": None}}) is None
    assert admission_devices.bind_answer({"status": []}) is None
    assert admission_devices.attachment({"status": {"attachment": {}}}) == Attachment(vmi="")


def test_a_lease_holder_reads_as_written_or_empty() -> None:
    lease = {"spec": {"holderIdentity": "replica-a", "renewTime": "2026-12-05T12:00:00.000000Z"}}
    assert leases.holder(lease) == leases.Holder("replica-a", "2026-12-05T12:00:00.000000Z")
    assert leases.holder(None) == leases.Holder("", "")
    assert leases.holder({"spec": {"holderIdentity": 5}}) == leases.Holder("", "")


def test_values_read_as_the_expected_type_or_empty_and_are_not_copied() -> None:
    listed, mapped = [1, 2], {"a": 1}
    assert values.array(listed) is listed
    assert values.mapping(mapped) is mapped
    assert values.array("ab") == ()
    assert values.array_or_none({"a": 1}) is None
    assert values.mapping([]) is meta.EMPTY
    assert values.mapping_or_none("x") is None
    assert (values.string(5), values.whole(True), values.whole(3)) == ("", None, 3)


def test_a_bind_answer_id_is_read_alone_for_a_waiter() -> None:
    assert admission_devices.answer_id({"status": {"bindAnswer": {"id": "r", "time": "x"}}}) == "r"
    assert admission_devices.answer_id({"status": {"bindAnswer": {"id": 5}}}) == ""
    assert admission_devices.answer_id({"status": {"bindAnswer": None}}) == ""
    assert admission_devices.answer_id({}) == ""
