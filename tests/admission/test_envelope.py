"""The envelope and the device-refs parser: answers, refusals, and fuzzed garbage that is never allowed."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.admission.devices import DeviceWebhook
from cozygpu.admission.envelope import Request, Verdict, respond
from cozygpu.admission.metrics import METRIC_REASONS, REASON_BAD_REQUEST
from cozygpu.admission.pods import LauncherPodWebhook
from cozygpu.admission.refs import DeviceRef, RefsError, TemplateRef, parse_refs
from cozygpu.admission.view import SnapshotSource
from cozygpu.admission.vmi import VMIConfig, VMIWebhook
from cozygpu.model import refusals
from cozygpu.model.derive import derive_snapshot
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import GPUClassView, Mode, Snapshot


class FixedSource(SnapshotSource):
    """A snapshot source over a fixed snapshot (no cache)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._fixed = snapshot

    async def snapshot(self) -> Snapshot:
        return self._fixed


def empty_world() -> Snapshot:
    """One class and no node: every order and every start is refused."""
    gpu_class = GPUClassView(name="h100", mode=Mode.PASSTHROUGH, resource_name="nvidia.com/H100")
    return derive_snapshot(now=datetime(2026, 12, 3, tzinfo=UTC), classes=[gpu_class], devices=[], nodes=[],
                    inventories=[], pods=[], vmis=[], namespaces=[], quotas={}, hoster_names=(), permitted=None)


def review(obj: Any, *, uid: Any = "u-1", kind: str = "GPUDevice", dry_run: bool = False) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": "CREATE", "namespace": "tenant-a", "kind": {"kind": kind},
                        "object": obj, "dryRun": dry_run, "userInfo": {"username": "someone"}}}


async def call(handler: Any, body: bytes, *, content_type: str = "application/json") -> tuple[int, Any, str]:
    status, raw, outcome, _reason = await respond("test", handler, method="POST", content_type=content_type,
                                                  body=body, deadline=5.0)
    return status, orjson.loads(raw), outcome


async def test_an_answer_echoes_the_request_uid_and_carries_the_patch() -> None:
    async def mutate(request: Request) -> Verdict:
        return Verdict.allow([{"op": "add", "path": "/x", "value": request.name or 1}])

    status, answer, outcome = await call(mutate, orjson.dumps(review({"metadata": {}}, uid="abc")))
    assert (status, outcome) == (200, "allowed")
    assert answer["response"]["uid"] == "abc"
    assert json.loads(base64.b64decode(answer["response"]["patch"])) == [{"op": "add", "path": "/x", "value": 1}]


async def test_a_crash_or_an_overrun_is_a_refusal_with_a_message_never_a_traceback() -> None:
    async def crash(_request: Request) -> Verdict:
        raise KeyError("spec")

    status, answer, outcome = await call(crash, orjson.dumps(review({})))
    assert (status, outcome, answer["response"]["allowed"]) == (200, "error", False)
    assert "internal error (KeyError: 'spec')" in answer["response"]["status"]["message"]

    async def hang(_request: Request) -> Verdict:
        await asyncio.Event().wait()
        raise AssertionError

    _, raw, _, _ = await respond("test", hang, method="POST", content_type="application/json",
                              body=orjson.dumps(review({})), deadline=0.01)
    assert "no answer within 0.01 s" in orjson.loads(raw)["response"]["status"]["message"]


async def test_an_answer_is_counted_with_its_refusal_reason_from_a_bounded_set() -> None:
    async def refuse_budget(_request: Request) -> Verdict:
        return Verdict.refuse(refusals.budget_exceeded(key="k", namespace="tenant-a", limit=1, in_use=1, requested=1))

    async def refuse_anything(_request: Request) -> Verdict:
        return Verdict(allowed=False, message="odd", reason="SomethingATenantWrote")

    async def allow(_request: Request) -> Verdict:
        return Verdict.allow()

    body = orjson.dumps(review({}))
    reasons = {}
    for handler in (refuse_budget, refuse_anything, allow):
        *_, reasons[handler.__name__] = await respond("test", handler, method="POST",
                                                      content_type="application/json", body=body, deadline=5.0)
    assert reasons == {"refuse_budget": "BudgetExceeded", "refuse_anything": "Other", "allow": ""}
    *_, bad = await respond("test", allow, method="POST", content_type="text/plain", body=body, deadline=5.0)
    assert bad == "BadRequest"


def test_every_reason_the_webhooks_refuse_with_is_a_label_value_of_its_own() -> None:
    """A reason missing from the set would be counted as Other: the panel of refusals by reason would hide it.

    A refusal's reason is a ``Reason`` (built in ``model/refusals.py`` only, ``tests/model/test_refusal_home.py``);
    the rest are the envelope's answers that are not refusals.
    """
    assert {str(r) for r in Reason} <= METRIC_REASONS
    own = {Verdict.not_ready("x").reason, Verdict.internal_error("x").reason, REASON_BAD_REQUEST}
    assert own <= METRIC_REASONS, own - METRIC_REASONS


@pytest.mark.parametrize(("body", "content_type", "expected"), [
    (b"{", "application/json", "not JSON"),
    (b"[]", "application/json", "not a JSON object"),
    (orjson.dumps({"apiVersion": "v1", "kind": "Pod"}), "application/json", "expected AdmissionReview"),
    (orjson.dumps(review({}, uid="")), "application/json", "has no uid"),
    (orjson.dumps(review(None)), "application/json", "has no object"),
    (orjson.dumps(review({})), "text/plain", "is not application/json"),
])
async def test_what_is_not_an_admission_review_is_a_bad_request_naming_the_problem(
        body: bytes, content_type: str, expected: str) -> None:
    async def never(_request: Request) -> Verdict:
        raise AssertionError("not called")

    status, answer, _ = await call(never, body, content_type=content_type)
    assert status == 400
    assert expected in answer["error"]


def test_the_refs_parser_reads_both_shapes_and_names_the_bad_entry() -> None:
    text = json.dumps([{"device": "held-1"}, {"template": "t", "class": "h100", "count": 2}])
    assert parse_refs(text) == (DeviceRef("held-1"), TemplateRef("t", "h100", 2))
    for bad, expected in [
        ("[]", "empty list"),
        ('{"device": "a"}', "must be a JSON list"),
        ('[{"device": "a"}, {"device": "a"}]', "entry 1: device 'a' is named twice"),
        ('[{"device": "a"}, {"template": "t", "class": "h100"}]', "entry 1: template 't' needs count"),
        ('[{"template": "t", "class": "H100", "count": 1}]', "entry 0: class 'H100' is not a DNS label"),
        ('[{"device": "a", "count": 1}]', "entry 0: must be"),
        ('[{"template": "t", "class": "c", "count": true}]', "entry 0: count must be a whole number"),
    ]:
        with pytest.raises(RefsError, match=expected):
            parse_refs(bad)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=8) | st.sampled_from(["h100", "held", "t"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["device", "template", "class", "count", "x", "metadata", "spec"]), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=json_values)
def test_no_annotation_the_parser_refuses_crashes_it_and_what_it_accepts_is_well_formed(raw: Any) -> None:
    try:
        refs, problem = parse_refs(json.dumps(raw)), ""
    except RefsError as error:
        refs, problem = (), str(error)
    if problem:
        assert problem.isprintable()
        assert problem.startswith(f"annotation {keys.DEVICE_REFS_ANNOTATION}") or problem.startswith("entry ")
    else:
        assert refs
        assert all(isinstance(r, DeviceRef) or r.count >= 1 for r in refs)


def _mutations() -> st.SearchStrategy[bytes]:
    base_vmi = {"metadata": {"name": "vm", "labels": {keys.DEVICE_REFS_LABEL: "true"}, "annotations": {
        keys.DEVICE_REFS_ANNOTATION: json.dumps([{"template": "t", "class": "h100", "count": 1}])}},
        "spec": {"domain": {"devices": {}}}}
    base_device = {"metadata": {"name": "d"}, "spec": {"className": "h100", "count": 1}}
    base_pod = {"metadata": {"ownerReferences": [{"kind": "VirtualMachineInstance", "apiVersion": "kubevirt.io/v1",
                                                  "name": "vm", "uid": "u", "controller": True}]}, "spec": {}}

    def mutate(obj: dict[str, Any], path: list[str], value: Any, annotation: Any, dry: bool) -> bytes:
        out = json.loads(json.dumps(obj))
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict) and path:
            node[path[-1]] = value
        if annotation is not None and isinstance(out.get("metadata"), dict):
            out["metadata"]["annotations"] = {keys.DEVICE_REFS_ANNOTATION: annotation}
        return orjson.dumps(review(out, dry_run=dry))

    paths = st.lists(st.sampled_from(["metadata", "spec", "name", "className", "count", "domain", "devices",
                                      "annotations", "labels", "ownerReferences"]), min_size=1, max_size=3)
    annotations = st.none() | st.text(max_size=30) | json_values.map(json.dumps)
    whole = st.builds(mutate, st.sampled_from([base_vmi, base_device, base_pod]), paths, json_values, annotations,
                      st.booleans())
    return st.one_of(whole, st.binary(max_size=64), json_values.map(orjson.dumps))


_SOURCE = FixedSource(empty_world())
_HANDLERS = [DeviceWebhook(_SOURCE), LauncherPodWebhook(_SOURCE),
             VMIWebhook(None, None, _SOURCE, VMIConfig(namespace="cozy-gpu", bind_wait=1.0,  # type: ignore[arg-type]
                                                       raw_forbidden=True))]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    yield running
    running.close()


@settings(max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.function_scoped_fixture])
@given(body=_mutations())
def test_fuzzed_reviews_never_crash_a_webhook_and_are_never_allowed_where_nothing_can_be_met(
        loop: asyncio.AbstractEventLoop, body: bytes) -> None:
    handlers = _HANDLERS

    async def each() -> None:
        for handler in handlers:
            status, answer, outcome = await call(handler, body)
            if status == 400:
                assert answer["error"].isprintable()
                continue
            response = answer["response"]
            assert outcome != "error", response
            assert response["allowed"] is False, response
            assert response["status"]["message"]
            assert response["status"]["message"].isprintable()

    loop.run_until_complete(each())
