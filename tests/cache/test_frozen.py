"""Objects handed out by the cache cannot be changed for everyone."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from cozygpu.cache.frozen import FrozenDict, FrozenList, freeze, is_frozen, thaw

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"app": "x"}},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    "status": {"phase": "Running", "ready": True, "restarts": 0, "ratio": 0.5, "ip": None},
}

WRITES: dict[str, Callable[[Any], object]] = {
    "set a key": lambda o: o.__setitem__("x", 1),
    "delete a key": lambda o: o.__delitem__("spec"),
    "update": lambda o: o.update(x=1),
    "setdefault": lambda o: o.setdefault("x", 1),
    "pop": lambda o: o.pop("spec"),
    "popitem": lambda o: o.popitem(),
    "clear": lambda o: o.clear(),
    "in-place merge": lambda o: o.__ior__({"x": 1}),
    "set a nested key": lambda o: o["metadata"]["labels"].__setitem__("app", "y"),
    "append to a list": lambda o: o["spec"]["containers"].append({}),
    "extend a list": lambda o: o["spec"]["containers"].extend([{}]),
    "insert into a list": lambda o: o["spec"]["containers"].insert(0, {}),
    "set a list item": lambda o: o["spec"]["containers"].__setitem__(0, {}),
    "set a list slice": lambda o: o["spec"]["containers"].__setitem__(slice(0, 1), []),
    "delete a list item": lambda o: o["spec"]["containers"].__delitem__(0),
    "in-place add to a list": lambda o: o["spec"]["containers"].__iadd__([{}]),
    "in-place repeat a list": lambda o: o["spec"]["containers"].__imul__(2),
    "pop a list": lambda o: o["spec"]["containers"].pop(),
    "remove from a list": lambda o: o["spec"]["containers"].remove(o["spec"]["containers"][0]),
    "sort a list": lambda o: o["spec"]["containers"].sort(),
    "reverse a list": lambda o: o["spec"]["containers"].reverse(),
    "clear a list": lambda o: o["spec"]["containers"].clear(),
    "change a container's requests": lambda o: o["spec"]["containers"][0]["resources"]["requests"].update(cpu="2"),
}


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_a_frozen_object_refuses_every_write(write: Callable[[Any], object]) -> None:
    frozen = freeze(copy.deepcopy(POD))
    with pytest.raises(TypeError, match="read-only"):
        write(frozen)
    assert frozen == POD


def test_a_frozen_object_reads_compares_and_serialises_like_the_decoded_json() -> None:
    frozen = freeze(copy.deepcopy(POD))
    assert frozen == POD
    assert json.loads(json.dumps(frozen)) == POD
    assert isinstance(frozen, dict)
    assert isinstance(frozen["spec"]["containers"], list)
    assert frozen["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    assert frozen.get("missing") is None
    assert sorted(frozen) == ["metadata", "spec", "status"]


def test_freezing_does_not_share_state_with_the_decoded_input() -> None:
    raw = copy.deepcopy(POD)
    frozen = freeze(raw)
    raw["metadata"]["labels"]["app"] = "changed"
    assert frozen["metadata"]["labels"]["app"] == "x"


def test_thawing_gives_a_mutable_copy_that_leaves_the_cached_object_alone() -> None:
    frozen = freeze(copy.deepcopy(POD))
    mutable = thaw(frozen)
    mutable["metadata"]["labels"]["app"] = "y"
    mutable["spec"]["containers"].append({"name": "d"})
    assert type(mutable) is dict
    assert type(mutable["spec"]["containers"]) is list
    assert frozen == POD


def test_copying_a_frozen_object_gives_a_mutable_copy() -> None:
    frozen = freeze(copy.deepcopy(POD))
    deep = copy.deepcopy(frozen)
    deep["spec"]["containers"][0]["name"] = "other"
    shallow = copy.copy(frozen)
    shallow["extra"] = True
    merged = frozen | {"extra": True}
    assert frozen == POD
    assert type(deep) is dict
    assert type(shallow) is dict
    assert type(merged) is dict
    with pytest.raises(TypeError):
        merged["spec"]["containers"].append({})  # a shallow copy still shares the frozen inside


def test_a_frozen_object_pickles_to_plain_json_values() -> None:
    restored = pickle.loads(pickle.dumps(freeze(copy.deepcopy(POD))))
    assert restored == POD
    assert type(restored) is dict
    restored["spec"]["containers"].append({})


def test_keys_and_short_strings_are_shared_between_objects() -> None:
    first = freeze(json.loads(json.dumps(POD)))
    second = freeze(json.loads(json.dumps(POD)))
    first_key = next(iter(first["metadata"]))
    second_key = next(iter(second["metadata"]))
    assert first_key is second_key
    assert first["status"]["phase"] is second["status"]["phase"]


def test_freezing_a_frozen_object_reuses_it() -> None:
    frozen = freeze(copy.deepcopy(POD))
    assert freeze(frozen) is frozen
    assert is_frozen(frozen)
    assert is_frozen(frozen["spec"]["containers"])
    assert not is_frozen(POD)
    assert isinstance(freeze([{"a": (1, 2)}])[0]["a"], FrozenList)
    assert isinstance(freeze({"a": {"b": 1}})["a"], FrozenDict)
