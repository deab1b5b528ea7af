"""Bounded admission (issue 22): an extreme AdmissionReview costs a webhook what an ordinary one costs.

Every webhook (GPUDevice, VMI, launcher pod) and the envelope they share is
sent reviews whose numbers, lengths and counts are extreme: a count of
3,000,000, thousands of device-refs entries, deep or wide JSON, long strings,
huge ``gpus`` lists on a VMI and huge lists on a launcher pod. Each must get a
proper answer (an AdmissionReview echoing the UID, or a 400 for what cannot be
read as one), a refusal naming the limit and the numbers where one applies,
never a crash.

Time is not asserted (speed is the bench's: ``bench/bench_admission.py
--extreme``). The work is: :class:`Work` counts the Python lines a call runs
and the memory it allocates at its peak, and an extreme call may cost only a
small multiple of the ordinary call of the same webhook. A call that runs away
is stopped by the meter, so a regression fails quickly instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tracemalloc
from collections.abc import Iterator, Mapping
from types import FrameType
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.admission import bounds
from cozygpu.admission.devices import DeviceWebhook
from cozygpu.admission.envelope import MAX_BODY, Handler, respond
from cozygpu.admission.metrics import METRIC_REASONS
from cozygpu.admission.pods import LauncherPodWebhook
from cozygpu.admission.refs import MAX_REFS
from cozygpu.admission.view import SnapshotSource
from cozygpu.admission.vmi import VMIConfig, VMIWebhook
from cozygpu.model.snapshot import Phase, Snapshot
from tests.model.factories import device, gpu_nodes, snapshot

NAMESPACE = "tenant-a"
H100 = "nvidia.com/GH100_H100_SXM5_80GB"
#: Lines an extreme call may run beyond the ordinary call of its webhook (a refusal message, a check or two).
LINE_SLACK = 3_000
#: Bytes an extreme call may allocate at its peak beyond the ordinary call (the answer and its message).
MEMORY_SLACK = 512 * 1024
#: A call past this many traced lines has run away: the meter stops it (about a second under the tracer).
RUNAWAY = 400_000


class RanAway(BaseException):
    """Raised by the meter inside a call that ran past ``RUNAWAY`` lines (a BaseException: no handler catches it)."""


@attrs.define
class Work:
    """What one call cost: Python lines run, and the peak of memory allocated while it ran."""

    lines: int = 0
    peak: int = 0
    ran_away: bool = False

    def _trace(self, frame: FrameType, event: str, _arg: object) -> Any:
        self.lines += 1
        if self.lines > RUNAWAY:
            self.ran_away = True
            raise RanAway(f"more than {RUNAWAY} lines")
        return self._trace

    def measure(self, call: Any) -> Any:
        """``call()`` under the meter; its result, or None when it ran away."""
        tracemalloc.start()
        sys.settrace(self._trace)
        try:
            return call()
        except RanAway:
            return None
        finally:
            sys.settrace(None)
            self.peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()


class FixedSource(SnapshotSource):
    def __init__(self, snapshot: Snapshot) -> None:
        self._fixed = snapshot

    async def snapshot(self) -> Snapshot:
        return self._fixed


class NoStore:
    """The VMI webhook's cache, for calls that end before a write (refused, or a dry run of templates)."""

    def store(self, _spec: object) -> NoStore:
        return self

    def get(self, _namespace: str, _name: str) -> None:
        return None


def world() -> Snapshot:
    """Two nodes of 8 H100s; ``held`` is Bound on n1 and attached to VMI ``vm`` (its launcher pod is pinned)."""
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 8))
    return snapshot(devices=[device("held", count=2, phase=Phase.BOUND, node="n1", vmi="vm")], nodes=nodes,
                    inventories=inventories)


SOURCE = FixedSource(world())
HANDLERS: dict[str, Handler] = {
    "gpudevice": DeviceWebhook(SOURCE),
    "vmi": VMIWebhook(NoStore(), None, SOURCE,  # type: ignore[arg-type]
                      VMIConfig(namespace="cozy-gpu", bind_wait=1.0, raw_forbidden=True)),
    "launcher-pod": LauncherPodWebhook(SOURCE),
}


def review(obj: Any, *, uid: str = "u-1", dry_run: bool = True, namespace: str = NAMESPACE) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": "CREATE", "namespace": namespace, "kind": {"kind": "X"},
                        "object": obj, "dryRun": dry_run, "userInfo": {"username": "someone"}}}


def gpudevice(count: Any = 1, *, class_name: Any = "h100", name: Any = "d") -> dict[str, Any]:
    return {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": name},
            "spec": {"className": class_name, "count": count}}


def vmi(refs: Any = None, *, name: Any = "vm-new", devices: Mapping[str, Any] | None = None,
        spec: Mapping[str, Any] | None = None, annotation: str | None = None) -> dict[str, Any]:
    text = annotation if annotation is not None else json.dumps(
        refs if refs is not None else [{"template": "gpu", "class": "h100", "count": 1}])
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "labels": {keys.DEVICE_REFS_LABEL: "true"},
                         "annotations": {keys.DEVICE_REFS_ANNOTATION: text}},
            "spec": {"domain": {"devices": dict(devices or {}), "memory": {"guest": "1Gi"}}, **(spec or {})}}


def launcher_pod(*, owners: list[Any] | None = None, spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    owner = {"kind": "VirtualMachineInstance", "apiVersion": "kubevirt.io/v1", "name": "vm", "uid": "u",
             "controller": True}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "virt-launcher-vm-abcde", "ownerReferences": owners if owners is not None
                         else [owner], "labels": {keys.DEVICE_REFS_LABEL: "true", "kubevirt.io": "virt-launcher"}},
            "spec": {"containers": [{"name": "compute", "image": "virt-launcher"}], **(spec or {})}}


TYPICAL: dict[str, bytes] = {
    "gpudevice": orjson.dumps(review(gpudevice())),
    "vmi": orjson.dumps(review(vmi())),
    "launcher-pod": orjson.dumps(review(launcher_pod())),
}


@attrs.frozen
class Answer:
    status: int
    body: Any
    work: Work


def send(webhook: str, body: bytes) -> Answer:
    """One call of ``webhook``'s envelope and handler, metered."""
    work = Work()

    def call() -> tuple[int, bytes, str, str]:
        return asyncio.run(respond(webhook, HANDLERS[webhook], method="POST", content_type="application/json",
                                   body=body, deadline=30.0))

    result = work.measure(call)
    if result is None:
        return Answer(0, None, work)
    status, raw, _outcome, _reason = result
    return Answer(status, orjson.loads(raw), work)


_ordinary: dict[str, Work] = {}


def ordinary(webhook: str) -> Work:
    """The work of the ordinary call of ``webhook`` (measured once; the slack absorbs its noise)."""
    if webhook not in _ordinary:
        send(webhook, TYPICAL[webhook])  # imports and first-call caches, unmetered by what follows
        _ordinary[webhook] = send(webhook, TYPICAL[webhook]).work
    return _ordinary[webhook]


def check_bounded(webhook: str, answer: Answer, *, body: bytes) -> None:
    """The call did about the work of an ordinary one: lines and memory, whatever the body carried."""
    base = ordinary(webhook)
    assert not answer.work.ran_away, f"{webhook}: the call ran past {RUNAWAY} lines"
    assert answer.work.lines <= 2 * base.lines + LINE_SLACK, (answer.work.lines, base.lines)
    assert answer.work.peak <= 2 * base.peak + MEMORY_SLACK + parse_cost(body), (answer.work.peak, base.peak)


def parse_cost(body: bytes) -> int:
    """The peak memory of parsing ``body`` once, when the envelope may parse it at all (else nothing).

    Parsing costs what the body holds (orjson takes ~13 bytes per byte of a
    long string); beyond that, a call may build nothing sized by the body.
    """
    items = body.count(b"[") + body.count(b"{") + body.count(b",")
    if len(body) > MAX_BODY or items > bounds.MAX_JSON_ITEMS:
        return 0
    tracemalloc.start()
    with contextlib.suppress(orjson.JSONDecodeError):
        orjson.loads(body)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return 2 * peak  # the object, and the annotation parsed again (a part of it)


def check_answer(answer: Answer, *, uid: str = "u-1") -> Mapping[str, Any]:
    """A proper AdmissionReview answer echoing ``uid`` (a crash is an ``error`` refusal: not proper here)."""
    assert answer.status == 200, answer.body
    assert (answer.body["apiVersion"], answer.body["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response: Mapping[str, Any] = answer.body["response"]
    assert response["uid"] == uid
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        status = response["status"]
        assert status["reason"] != "InternalError", status["message"]
        assert status["reason"] in METRIC_REASONS, status["reason"]
        assert status["message"].isprintable()
        assert len(status["message"]) <= bounds.MAX_MESSAGE
    return response


def refused(answer: Answer, *expected: str) -> str:
    response = check_answer(answer)
    assert response["allowed"] is False, response
    message: str = response["status"]["message"]
    for part in expected:
        assert part in message, message
    return message


# -- targeted extremes ------------------------------------------------------------------------------------------


def test_an_ordinary_call_of_each_webhook_is_answered_and_allowed_where_it_can_be_met() -> None:
    for webhook in HANDLERS:
        answer = send(webhook, TYPICAL[webhook])
        assert check_answer(answer)["allowed"] is True, answer.body
        assert not answer.work.ran_away


@pytest.mark.parametrize("count", [3_000_000, 2**31 - 1, 2**63 - 1])
def test_a_vmi_template_of_a_huge_count_is_refused_with_the_numbers_at_the_cost_of_one_unit(count: int) -> None:
    body = orjson.dumps(review(vmi([{"template": "gpu", "class": "h100", "count": count}])))
    answer = send("vmi", body)
    refused(answer, "VMI tenant-a/vm-new", f"order of {count}", "exceeds it by")
    check_bounded("vmi", answer, body=body)


@pytest.mark.parametrize("count", [3_000_000, 2**63 - 1, -(2**63), 0])
def test_a_gpudevice_order_of_a_huge_or_null_count_is_refused_with_the_numbers(count: int) -> None:
    body = orjson.dumps(review(gpudevice(count)))
    answer = send("gpudevice", body)
    refused(answer, "GPUDevice tenant-a/d", str(count))
    check_bounded("gpudevice", answer, body=body)


def test_a_count_past_64_bits_is_not_an_integer_and_is_refused_as_such() -> None:
    body = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1",' \
           b'"operation":"CREATE","namespace":"tenant-a","object":{"metadata":{"name":"d"},' \
           b'"spec":{"className":"h100","count":' + b"9" * 300 + b"}}}}"
    answer = send("gpudevice", body)
    if answer.status == 200:
        refused(answer, "integer spec.count")
    else:
        assert answer.status == 400
        assert "not JSON" in answer.body["error"]
    check_bounded("gpudevice", answer, body=body)


def test_the_vmi_total_over_its_references_is_capped_before_any_gpus_entry_is_built() -> None:
    """32 templates of 200 GPUs each: each is refused by the class's free units, and so is their sum."""
    refs = [{"template": f"t{i}", "class": "h100", "count": 200} for i in range(MAX_REFS)]
    answer = send("vmi", orjson.dumps(review(vmi(refs))))
    refused(answer, "VMI tenant-a/vm-new", "order of 200")
    check_bounded("vmi", answer, body=b"")


def test_a_vmi_naming_an_existing_device_of_a_huge_count_is_refused_by_the_per_vm_cap() -> None:
    huge = FixedSource(snapshot(devices=[device("big", count=3_000_000)], nodes=gpu_nodes(("n1", 8))[0],
                                inventories=gpu_nodes(("n1", 8))[1]))
    handler = VMIWebhook(NoStore(), None, huge,  # type: ignore[arg-type]
                         VMIConfig(namespace="cozy-gpu", bind_wait=1.0, raw_forbidden=True))
    work = Work()
    body = orjson.dumps(review(vmi([{"device": "big"}])))
    result = work.measure(lambda: asyncio.run(respond("vmi", handler, method="POST",
                                                      content_type="application/json", body=body, deadline=30.0)))
    assert result is not None, "ran away"
    answer = Answer(result[0], orjson.loads(result[1]), work)
    refused(answer, "3000000 GPUs", f"at most {bounds.MAX_VMI_GPUS}")
    check_bounded("vmi", answer, body=body)


@pytest.mark.parametrize(("annotation", "expected"), [
    (json.dumps([{"device": f"d{i}"} for i in range(500)]), "500 entries; at most 32"),
    (json.dumps([{"device": f"d{i}"} for i in range(10_000)]), f"characters, at most {bounds.MAX_REFS_TEXT}"),
    ("[" * 1000 + "]" * 1000, "entry 0: must be an object, not a list"),
    (json.dumps([{"device": "x" * 10_000}]), "is not a DNS subdomain"),
    (json.dumps([{"template": "t", "class": "c" * 10_000, "count": 1}]), "is not a DNS label"),
    (json.dumps([{"template": "t", "class": "h100", "count": 1, **{f"k{i}": i for i in range(1_000)}}]),
     "unknown field(s)"),
    (json.dumps([{"device": [[[[["deep"]]]]] * 500}]), "must be a non-empty string"),
    (" " * (bounds.MAX_REFS_TEXT + 1) + "[]", f"at most {bounds.MAX_REFS_TEXT}"),
], ids=["500-entries", "10k-entries", "deep", "long-device", "long-class", "wide-entry", "wide-value", "long-text"])
def test_an_extreme_device_refs_annotation_is_refused_naming_the_entry_and_the_limit(annotation: str,
                                                                                     expected: str) -> None:
    body = orjson.dumps(review(vmi(annotation=annotation)))
    answer = send("vmi", body)
    refused(answer, "VMI tenant-a/vm-new", expected)
    check_bounded("vmi", answer, body=body)


def _gpus(n: int) -> list[dict[str, str]]:
    return [{"name": f"g{i}", "deviceName": H100} for i in range(n)]


@pytest.mark.parametrize(("spec", "devices", "expected"), [
    ({}, {"gpus": _gpus(5_000)}, "spec.domain.devices.gpus: 5000 entries, at most"),
    ({}, {"hostDevices": _gpus(5_000)}, "spec.domain.devices.hostDevices: 5000 entries, at most"),
    ({}, {"gpus": _gpus(3)}, "raw GPU names are forbidden"),
    ({"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(10_000)]}, {},
     "spec.tolerations: 10000 entries, at most"),
    ({"nodeSelector": {f"k{i}": "v" for i in range(10_000)}}, {}, "spec.nodeSelector: 10000 entries, at most"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": ["a"]}]}] * 2_000}}}}, {},
     "nodeSelectorTerms: 2000 entries, at most"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": [f"v{i}" for i in range(10_000)]}]}]}}}},
     {}, "257 values or more, at most 256"),
    ({"domain": {"devices": {}, "resources": {"requests": {f"r{i}": "1" for i in range(10_000)}}}}, {},
     "spec.domain.resources.requests: 10000 entries, at most"),
], ids=["gpus", "hostDevices", "raw-gpus", "tolerations", "nodeSelector", "terms", "values", "resources"])
def test_a_vmi_with_huge_lists_is_refused_naming_the_list_and_the_limit(
        spec: dict[str, Any], devices: dict[str, Any], expected: str) -> None:
    obj = vmi(devices=devices)
    obj["spec"] = {**obj["spec"], **spec}
    body = orjson.dumps(review(obj))
    answer = send("vmi", body)
    refused(answer, "VMI tenant-a/vm-new", expected)
    check_bounded("vmi", answer, body=body)


@pytest.mark.parametrize("where", ["vmi-name", "namespace", "uid"])
def test_long_names_are_refused_or_quoted_short_never_echoed_whole(where: str) -> None:
    long = "x" * 1_000_000
    if where == "vmi-name":
        body = orjson.dumps(review(vmi(name=long)))
    elif where == "namespace":
        body = orjson.dumps(review(vmi(), namespace=long))
    else:
        body = orjson.dumps(review(vmi(), uid=long))
    answer = send("vmi", body)
    if where == "uid":
        assert answer.status == 400
        assert f"at most {bounds.MAX_UID}" in answer.body["error"]
    else:
        refused(answer, "1000000 characters")
    check_bounded("vmi", answer, body=body)


@pytest.mark.parametrize(("pod", "expected"), [
    (launcher_pod(owners=[{"kind": "Thing", "name": f"o{i}"} for i in range(5_000)]),
     "metadata.ownerReferences: 5000 entries, at most"),
    (launcher_pod(owners=[{"kind": "VirtualMachineInstance", "apiVersion": "kubevirt.io/v1", "controller": True,
                           "name": "v" * 1_000_000}]), "1000000 characters"),
    (launcher_pod(spec={"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(5_000)]}),
     "spec.tolerations: 5000 entries, at most"),
    (launcher_pod(spec={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
        * 2_000}}}}), "nodeSelectorTerms: 2000 entries, at most"),
], ids=["owners", "owner-name", "tolerations", "terms"])
def test_a_launcher_pod_with_huge_lists_is_refused_naming_the_list_and_the_limit(pod: dict[str, Any],
                                                                                 expected: str) -> None:
    body = orjson.dumps(review(pod))
    answer = send("launcher-pod", body)
    refused(answer, expected)
    check_bounded("launcher-pod", answer, body=body)


def test_a_launcher_pod_with_a_huge_container_list_is_pinned_at_the_cost_of_an_ordinary_one() -> None:
    """The webhook never reads containers: a huge list costs the parse only, under the JSON budget."""
    pod = launcher_pod(spec={"containers": [{"name": f"c{i}"} for i in range(bounds.MAX_JSON_ITEMS // 4)]})
    body = orjson.dumps(review(pod))
    answer = send("launcher-pod", body)
    assert check_answer(answer)["allowed"] is True
    check_bounded("launcher-pod", answer, body=body)


def _wide(n: int) -> list[Any]:
    return [[] for _ in range(n)]


@pytest.mark.parametrize("webhook", sorted(HANDLERS))
@pytest.mark.parametrize("shape", ["wide-list", "wide-object", "deep", "long-string", "over-size"])
def test_wide_deep_or_huge_json_is_refused_by_the_envelope_before_it_is_parsed(webhook: str, shape: str) -> None:
    """Refused naming the limit: a proper AdmissionReview when the request's UID can be read, else a 400."""
    base = {"gpudevice": gpudevice(), "vmi": vmi(), "launcher-pod": launcher_pod()}[webhook]
    if shape == "wide-list":
        body = orjson.dumps(review({**base, "extra": _wide(2_000_000)}))
        expected = f"at most {bounds.MAX_JSON_ITEMS}"
    elif shape == "wide-object":
        body = orjson.dumps(review({**base, "extra": {f"k{i}": 0 for i in range(300_000)}}))
        expected = f"at most {bounds.MAX_JSON_ITEMS}"
    elif shape == "deep":
        text = orjson.dumps(review({**base, "extra": "@"})).decode()
        body = text.replace('"@"', "[" * 2_000 + "]" * 2_000).encode()
        expected = f"deeper than {bounds.MAX_JSON_DEPTH}"
    elif shape == "long-string":
        body = orjson.dumps(review({**base, "extra": "z" * (MAX_BODY - 4096)}))
        expected = ""
    else:
        body = orjson.dumps(review({**base, "extra": "z" * MAX_BODY}))
        expected = f"exceeds {MAX_BODY}"
    answer = send(webhook, body)
    if shape == "over-size":
        assert answer.status == 400
        assert expected in answer.body["error"]
    elif shape == "long-string":
        check_answer(answer)  # a long string is cheap to parse: answered as the object deserves
    else:
        refused(answer, expected)
    check_bounded(webhook, answer, body=body)


# -- fuzzed extremes ----------------------------------------------------------------------------------------------

_BIG = st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.sampled_from(
    [0, 1, 8, 9, 256, 257, 3_000_000, 2**31 - 1, 2**63 - 1])
_NAMES = st.sampled_from(["h100", "gpu", "vm", "held", ""]) | st.text(max_size=4) | st.integers(1, 300_000).map(
    lambda n: "n" * n)


def _size() -> st.SearchStrategy[int]:
    return st.sampled_from([0, 1, 2, 33, 257, 5_000, 40_000])


@st.composite
def extreme_reviews(draw: st.DrawFn) -> tuple[str, bytes]:
    """A review for one webhook whose numbers, lengths and list sizes are drawn from the extremes."""
    webhook = draw(st.sampled_from(sorted(HANDLERS)))
    if webhook == "gpudevice":
        obj = gpudevice(draw(_BIG), class_name=draw(_NAMES), name=draw(_NAMES))
    elif webhook == "vmi":
        entries = draw(st.lists(st.fixed_dictionaries({
            "template": _NAMES, "class": st.sampled_from(["h100", "a10"]) | _NAMES, "count": _BIG}),
            min_size=1, max_size=3))
        entries *= draw(st.sampled_from([1, 20, 3_000]))
        for i, entry in enumerate(entries):
            entry["template"] = f"{entry['template']}{i}"
        devices = {"gpus": _gpus(draw(_size())), "hostDevices": _gpus(draw(_size()))}
        spec = {"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(draw(_size()))],
                "nodeSelector": {f"k{i}": "v" for i in range(draw(_size()))}}
        obj = vmi(entries, name=draw(_NAMES), devices=devices, spec=spec)
    else:
        n = draw(_size())
        obj = launcher_pod(spec={"containers": [{"name": f"c{i}"} for i in range(draw(_size()))],
                                 "tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(n)]})
        if draw(st.booleans()):
            obj["metadata"]["ownerReferences"] = [dict(obj["metadata"]["ownerReferences"][0],
                                                       name=draw(_NAMES))] * draw(st.sampled_from([1, 70, 5_000]))
    return webhook, orjson.dumps(review(obj))  # a dry run: an allowed start ends before any write


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=extreme_reviews())
def test_fuzzed_extreme_reviews_are_answered_properly_at_a_bounded_cost(case: tuple[str, bytes]) -> None:
    webhook, body = case
    answer = send(webhook, body)
    check_bounded(webhook, answer, body=body)
    if answer.status == 400:
        assert answer.body["error"].isprintable()
        return
    check_answer(answer)


@pytest.fixture(autouse=True)
def _no_tracer_left() -> Iterator[None]:
    yield
    assert sys.gettrace() is None


def test_the_meter_sees_work_that_grows_with_a_number() -> None:
    """The meter itself: a loop sized by a count shows in the lines, and a runaway is stopped."""
    small, large = Work(), Work()
    small.measure(lambda: [i for i in range(10)])
    large.measure(lambda: [i for i in range(10_000)])
    assert large.lines > small.lines + 9_000
    runaway = Work()
    assert runaway.measure(lambda: [i for i in range(10 * RUNAWAY)]) is None
    assert runaway.ran_away
