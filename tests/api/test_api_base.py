"""The API floor's base: metadata read without a KeyError, one condition merge, one timestamp format."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from cozygpu.api import conditions, meta, times
from cozygpu.api.conditions import Condition

T0 = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)


def test_metadata_of_a_malformed_object_reads_as_empty_without_raising() -> None:
    broken = {"metadata": {"name": 7, "finalizers": "x", "labels": ["a"], "generation": True}, "status": []}
    assert meta.key(broken) == ("", "")
    assert meta.finalizers(broken) == ()
    assert meta.labels(broken) == {}
    assert meta.generation(broken) is None
    assert meta.status(broken) == {}
    assert meta.key(None) == ("", "")


def test_metadata_of_a_well_formed_object() -> None:
    obj = {"metadata": {"name": "gpu-1", "namespace": "tenant-a", "resourceVersion": "42", "generation": 3,
                        "finalizers": ["a", 5, "b"], "deletionTimestamp": "2026-12-05T12:00:00Z",
                        "ownerReferences": [{"kind": "GPUDevice"}, "junk"]}}
    assert meta.key(obj) == ("tenant-a", "gpu-1")
    assert meta.resource_version(obj) == "42"
    assert meta.generation(obj) == 3
    assert meta.finalizers(obj) == ("a", "b")
    assert meta.deleting(obj)
    assert meta.deletion_time(obj) == T0
    assert meta.owner_references(obj) == ({"kind": "GPUDevice"},)


def test_a_transition_time_moves_only_when_the_status_does() -> None:
    current = [{"type": "Bound", "status": "True", "reason": "a", "message": "a", "lastTransitionTime": "then"},
               {"type": "Other", "status": "False"}]
    later = T0 + timedelta(minutes=5)
    same = conditions.merge(current, [Condition("Bound", True, "b", "b")], later, generation=4)
    assert same[0] == {"type": "Bound", "status": "True", "reason": "b", "message": "b", "observedGeneration": 4,
                       "lastTransitionTime": "then"}
    assert same[1] == {"type": "Other", "status": "False"}, "a condition nobody asked for is kept as it was"
    flipped = conditions.merge(current, [Condition("Bound", False, "c", "c")], later)
    assert flipped[0]["lastTransitionTime"] == "2026-12-05T12:05:00Z"
    assert "observedGeneration" not in flipped[0]
    added = conditions.merge(None, [Condition("New", True, "r", "m")], T0)
    assert added == [{"type": "New", "status": "True", "reason": "r", "message": "m",
                      "lastTransitionTime": "2026-12-05T12:00:00Z"}]


def test_comparable_ignores_transition_times_and_order_but_not_the_generation() -> None:
    one = [{"type": "A", "status": "True", "lastTransitionTime": "x"}, {"type": "B", "status": "False"}]
    two = [{"type": "B", "status": "False"}, {"type": "A", "status": "True", "lastTransitionTime": "y"}]
    assert conditions.comparable(one) == conditions.comparable(two)
    assert conditions.comparable(one) != conditions.comparable([*one[:1], {**one[1], "observedGeneration": 2}])
    assert conditions.find(two, "A") == two[1]
    assert conditions.find(two, "C") is None


def test_timestamps_are_utc_rfc3339_and_a_naive_one_is_refused() -> None:
    east = T0.astimezone(timezone(timedelta(hours=3)))
    assert times.rfc3339(east) == "2026-12-05T12:00:00Z"
    assert times.micro_time(T0 + timedelta(microseconds=5)) == "2026-12-05T12:00:00.000005Z"
    with pytest.raises(ValueError, match="naive"):
        times.rfc3339(datetime(2026, 1, 1))
    assert times.parse_time("2026-12-05T12:00:00Z") == T0
    assert times.parse_time("2026-12-05T12:00:00") == T0, "a naive timestamp is taken as UTC"
    assert times.parse_time("not a time") is None
    assert times.parse_time(5) is None
