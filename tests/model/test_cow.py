"""The maps the read model shares with its snapshots: the model's side behaves as a dict, and a view
handed out never changes, however many changes and compactions follow."""

from __future__ import annotations

import copy
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.model.cow import CowMap, Layered

KEYS = st.integers(min_value=0, max_value=80)
OPS = st.lists(st.one_of(
    st.tuples(st.just("set"), KEYS, st.integers()),
    st.tuples(st.just("del"), KEYS, st.just(0)),
    st.tuples(st.just("freeze"), st.just(0), st.just(0)),
), max_size=400)


@settings(max_examples=300, deadline=None)
@given(start=st.dictionaries(KEYS, st.integers(), max_size=60), ops=OPS)
def test_a_cow_map_is_a_dict_and_its_views_never_change(start: dict[int, int], ops: list[tuple[str, int, int]]) -> None:
    base = dict(start)
    cow = CowMap(base)
    model = dict(start)
    views = [(cow.frozen(), dict(model))]
    for op, key, value in ops:
        if op == "set":
            cow[key] = value
            model[key] = value
        elif op == "del":
            assert (key in cow) == (key in model)
            if key in model:
                del cow[key]
                del model[key]
        else:
            view = cow.frozen()
            assert view is cow.frozen(), "the same view until the next change"
            views.append((view, dict(model)))
            # A map started from a view changes without touching it.
            other = CowMap.on(view)
            other[-1] = 0
            other.pop(next(iter(model), -1), None)
        assert len(cow) == len(model)
        assert dict(cow.items()) == model
        assert sorted(cow) == sorted(model)
        assert sorted(cow.values()) == sorted(model.values())
        assert cow.get(key) == model.get(key)
    assert base == start, "the dict a CowMap took over is never written"
    assert dict(copy.deepcopy(cow).items()) == model
    assert dict(pickle.loads(pickle.dumps(cow)).items()) == model
    for view, then in views:
        assert dict(view.items()) == then
        assert len(view) == len(then)
        assert view == then
        assert copy.deepcopy(view) == then
        assert sorted(view) == sorted(then)
        assert all(view[k] == v and k in view and view.get(k) == v for k, v in then.items())
        assert all((k not in view) and view.get(k, "none") == "none" for k in range(81) if k not in then)


def test_changes_on_top_fold_into_a_fresh_base_past_the_square_root() -> None:
    cow = CowMap({k: k for k in range(10_000)})
    for k in range(50):
        cow[k] = -k
    view = cow.frozen()
    assert isinstance(view, Layered), "50 changes on 10,000 stay on top"
    for k in range(50, 150):
        cow[k] = -k
    folded = cow.frozen()
    assert isinstance(folded, dict), "150 changes on 10,000 (more than 100) fold into a fresh base"
    assert folded[120] == -120
    assert view[120] == 120
    assert view[10] == -10
