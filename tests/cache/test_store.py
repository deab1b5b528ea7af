"""The store files objects by key and by named indexes, and replaces its content at once."""

from __future__ import annotations

from typing import Any

import pytest

from cozygpu.cache.frozen import FrozenDict, freeze
from cozygpu.cache.store import LABELS, NAMESPACE, Store, index_field, index_labels, index_namespace


def obj(namespace: str | None, name: str, rv: str = "1", **extra: Any) -> FrozenDict:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv, **extra.pop("meta", {})}
    if namespace is not None:
        meta["namespace"] = namespace
    frozen: FrozenDict = freeze({"metadata": meta, **extra})
    return frozen


def device_store() -> Store:
    return Store("gpudevices", {
        NAMESPACE: index_namespace,
        LABELS: index_labels,
        "node": index_field("status", "nodeName"),
    })


def names(objects: list[FrozenDict]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objects)


def test_an_upserted_object_is_found_by_namespace_and_name() -> None:
    store = device_store()
    event = store.upsert(obj("a", "d1"))
    assert event.type == "ADDED"
    assert event.old is None
    assert event.kind == "gpudevices"
    assert store.get("a", "d1") == obj("a", "d1")
    assert store.get("b", "d1") is None
    assert ("a", "d1") in store
    assert len(store) == 1


def test_cluster_scoped_objects_are_found_without_a_namespace() -> None:
    store = Store("nodes")
    store.upsert(obj(None, "node-1"))
    assert store.get(None, "node-1") is not None
    assert store.get("", "node-1") is not None
    assert names(store.list()) == ["node-1"]


def test_listing_a_namespace_returns_only_its_objects() -> None:
    store = device_store()
    for ns, name in [("a", "d1"), ("a", "d2"), ("b", "d3")]:
        store.upsert(obj(ns, name))
    assert names(store.list("a")) == ["d1", "d2"]
    assert names(store.list("c")) == []
    assert names(store.list()) == ["d1", "d2", "d3"]
    assert names(Store("x").list()) == []


def test_an_update_refiles_the_object_under_its_new_index_values() -> None:
    store = device_store()
    store.upsert(obj("a", "d1", status={"nodeName": "n1"}))
    event = store.upsert(obj("a", "d1", "2", status={"nodeName": "n2"}))
    assert event.type == "MODIFIED"
    assert event.old is not None
    assert event.old["status"]["nodeName"] == "n1"
    assert store.by_index("node", "n1") == []
    assert names(store.by_index("node", "n2")) == ["d1"]
    assert store.index_values("node") == ["n2"]


def test_a_deleted_object_leaves_every_index() -> None:
    store = device_store()
    store.upsert(obj("a", "d1", status={"nodeName": "n1"}, meta={"labels": {"app": "x"}}))
    event = store.delete(obj("a", "d1", "5"))
    assert event is not None
    assert event.type == "DELETED"
    assert event.old is not None
    assert event.old["metadata"]["resourceVersion"] == "1"
    assert store.get("a", "d1") is None
    assert store.by_index("node", "n1") == []
    assert store.by_index(LABELS, "app=x") == []
    assert store.index_values(NAMESPACE) == []
    assert store.delete(obj("a", "d1")) is None


def test_the_label_index_files_an_object_under_each_key_value_pair() -> None:
    store = device_store()
    store.upsert(obj("a", "d1", meta={"labels": {"app": "x", "tier": "gpu"}}))
    store.upsert(obj("a", "d2", meta={"labels": {"app": "x"}}))
    assert names(store.by_index(LABELS, "app=x")) == ["d1", "d2"]
    assert names(store.by_index(LABELS, "tier=gpu")) == ["d1"]


def test_a_field_index_skips_objects_without_the_field() -> None:
    store = device_store()
    store.upsert(obj("a", "pending"))
    store.upsert(obj("a", "empty", status={"nodeName": ""}))
    store.upsert(obj("a", "odd", status="not-a-dict"))
    assert store.index_values("node") == []


def test_an_indexer_that_fails_leaves_the_store_unchanged() -> None:
    def bad(o: FrozenDict) -> list[str]:
        if o["metadata"]["name"] == "boom":
            raise ValueError("bad object")
        return ["ok"]

    store = Store("things", {"bad": bad})
    store.upsert(obj(None, "boom-not"))
    with pytest.raises(ValueError, match="bad object"):
        store.upsert(obj(None, "boom"))
    assert store.get(None, "boom") is None
    assert names(store.by_index("bad", "ok")) == ["boom-not"]


def test_asking_for_an_unknown_index_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="node"):
        device_store().by_index("vmi", "x")
    with pytest.raises(KeyError, match="node"):
        device_store().index_values("vmi")


def test_a_replace_reports_exactly_the_differences() -> None:
    store = device_store()
    unchanged = obj("a", "same", "1")
    store.upsert(unchanged)
    store.upsert(obj("a", "changed", "1"))
    store.upsert(obj("a", "gone", "1", status={"nodeName": "n1"}))
    events = store.replace([unchanged, obj("a", "changed", "7"), obj("a", "new", "8")], "9")
    by_type = {(e.type, e.obj["metadata"]["name"]) for e in events}
    assert by_type == {("MODIFIED", "changed"), ("ADDED", "new"), ("DELETED", "gone")}
    deleted = next(e for e in events if e.type == "DELETED")
    assert deleted.obj["metadata"]["resourceVersion"] == "1"
    assert names(store.list()) == ["changed", "new", "same"]
    assert store.by_index("node", "n1") == []
    assert store.resource_version == "9"


def test_a_replace_with_the_same_content_reports_nothing() -> None:
    store = device_store()
    objects = [obj("a", f"d{i}", str(i)) for i in range(3)]
    store.replace(objects, "3")
    assert store.replace([obj("a", f"d{i}", str(i)) for i in range(3)], "4") == []


def test_lists_handed_out_are_the_callers_to_sort() -> None:
    store = device_store()
    store.upsert(obj("a", "b"))
    store.upsert(obj("a", "a"))
    listed = store.list()
    listed.sort(key=lambda o: o["metadata"]["name"])
    assert [o["metadata"]["name"] for o in listed] == ["a", "b"]
    assert len(store.list()) == 2
