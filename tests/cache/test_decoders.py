"""A pod page decoded by schema holds exactly what decoding it whole and slimming it would."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.cache.decoders import decode_pod_page
from cozygpu.cache.frozen import freeze
from cozygpu.cache.transforms import (
    POD_CONTAINER_FIELDS,
    POD_METADATA_FIELDS,
    POD_SPEC_FIELDS,
    POD_STATUS_FIELDS,
    slim_pod,
)
from tests.cache import shapes

Obj = dict[str, Any]

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.text(max_size=80))
json_value = st.recursive(json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)


def fields(kept: tuple[str, ...], **more: st.SearchStrategy[Any]) -> st.SearchStrategy[Obj]:
    """Objects with any subset of ``kept`` fields, fields nobody keeps, and ``more``."""
    names = [*kept, "noise", "env", "volumeMounts", "managedFields"]
    optional = {name: json_value for name in names if name not in more}
    return st.fixed_dictionaries({}, optional={**optional, **more})


pod_annotations = st.dictionaries(st.sampled_from([f"{keys.GROUP}/device-refs", f"{keys.GROUP}/x", "kubevirt.io/domain",
                                               "kubectl.kubernetes.io/last-applied-configuration"]),
                              st.text(max_size=20), max_size=4)
containers = st.one_of(st.none(), st.lists(fields(POD_CONTAINER_FIELDS), max_size=3))
pods = fields(
    (), metadata=st.one_of(fields(POD_METADATA_FIELDS, annotations=pod_annotations), st.none()),
    spec=st.one_of(fields(POD_SPEC_FIELDS, containers=containers, initContainers=containers), st.none()),
    status=st.one_of(fields(POD_STATUS_FIELDS), st.none()),
    apiVersion=st.just("v1"), kind=st.just("Pod"),
)


def slimmed_whole(page: Obj) -> list[Obj]:
    """The reference: every item decoded whole, then ``slim_pod``, then frozen, without apiVersion and kind."""
    out = []
    for item in copy.deepcopy(page["items"]):
        slim = slim_pod(item)
        slim.pop("apiVersion", None)
        slim.pop("kind", None)
        out.append(freeze(slim))
    return out


@settings(max_examples=300, deadline=None)
@given(items=st.lists(pods, max_size=4))
def test_any_pod_page_decodes_to_what_slim_pod_keeps(items: list[Obj]) -> None:
    page = {"kind": "PodList", "metadata": {"resourceVersion": "77", "continue": "tok"}, "items": items}
    decoded = decode_pod_page(orjson.dumps(page))
    assert decoded.items == slimmed_whole(page)
    assert (decoded.resource_version, decoded.continue_token) == ("77", "tok")


def test_a_launcher_pod_page_keeps_its_identity_resources_and_phase_and_nothing_else() -> None:
    pod = shapes.launcher_pod("tenant-a", "vm1", node="node-1", vmi_uid="vmi-uid")
    pod.update(shapes.launcher_pod_status(pod))
    pod["metadata"].update({"resourceVersion": "9", "uid": "u1", "managedFields": [{"manager": "virt-controller"}]})
    page = {"metadata": {"resourceVersion": "10"}, "items": [pod]}
    decoded = decode_pod_page(orjson.dumps(page))
    assert decoded.items == slimmed_whole(page)
    [slim] = decoded.items
    assert slim["metadata"]["uid"] == "u1"
    assert "managedFields" not in slim["metadata"]
    assert slim["status"] == {"phase": "Running"}
    assert [c["name"] for c in slim["spec"]["containers"]] == [c["name"] for c in pod["spec"]["containers"]]
    assert (decoded.resource_version, decoded.continue_token) == ("10", "")
    with pytest.raises(TypeError):
        slim["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "1"


def test_a_page_of_another_shape_is_decoded_the_plain_way_not_refused() -> None:
    page = {"metadata": {"resourceVersion": "5"},
            "items": [{"metadata": {"name": "odd", "namespace": "a"}, "spec": {"containers": "not a list"}}]}
    decoded = decode_pod_page(orjson.dumps(page))
    assert decoded.items == slimmed_whole(page)
    assert decoded.resource_version == "5"


def test_an_answer_that_is_not_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        decode_pod_page(b"<html>a proxy's error page</html>")
