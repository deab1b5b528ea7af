"""A keyed work's pass: each key settled by what the API server did with its own writes.

A refused key waits out its own backoff while the others are forgotten; a key
whose write was left when placement came due is ready again at once; a
key's "judge me again in" puts it off; judging stops after ``SLICE`` and
leaves the rest ready. ``send`` is a stand-in for the patcher with the
outcomes the test chooses (the patcher itself is tested against a real
API server).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from cozygpu.base.clock import FakeClock
from cozygpu.binder import reconciler
from cozygpu.binder.patcher import Sent, Write
from cozygpu.binder.reconciler import Due, reconcile
from cozygpu.passes.driver import Progress
from cozygpu.passes.keyed import KeyQueue
from cozygpu.passes.writes import Writes
from cozygpu.views import specs


def write(key: str) -> Write:
    return Write(kind=specs.GPU_DEVICES, path=f"/{key}", what=key)


class Server:
    """Takes every write but those named ``refuse``; leaves every write from ``stop_at`` on unsent."""

    def __init__(self, *, refuse: Iterable[str] = (), stop_at: str | None = None) -> None:
        self.refuse, self.stop_at = set(refuse), stop_at
        self.sent: list[str] = []

    async def __call__(self, writes: Iterable[Write], record: Writes, *,
                      stop: Callable[[], bool] | None = None) -> Sent:
        planned = list(writes)
        written: list[tuple[Write, None]] = []
        refused: list[Write] = []
        for at, one in enumerate(planned):
            if one.what == self.stop_at:
                return Sent(tuple(written), tuple(refused), tuple(planned[at:]))
            self.sent.append(one.what)
            if one.what in self.refuse:
                refused.append(one)
            else:
                written.append((one, None))
        return Sent(tuple(written), tuple(refused))


async def test_a_refused_key_waits_its_own_backoff_and_the_others_are_done() -> None:
    clock = FakeClock()
    queue: KeyQueue[str] = KeyQueue(clock, base=1.0)
    queue.add_all(["a", "b", "c"])
    server = Server(refuse={"b"})
    done = await reconcile(server, queue, lambda key: Due(writes=(write(key),)), Writes(), lambda: False)
    assert done.progress is Progress.DONE
    assert server.sent == ["a", "b", "c"]
    assert queue.take() == [], "a and c are done; b waits"
    assert queue.failures("b") == 1
    assert queue.failures("a") == 0
    clock.advance(1.0)
    assert queue.take() == ["b"]


async def test_keys_left_unsent_when_placement_came_due_are_ready_at_once() -> None:
    queue: KeyQueue[str] = KeyQueue(FakeClock())
    queue.add_all(["a", "b", "c"])
    server = Server(stop_at="b")
    done = await reconcile(server, queue, lambda key: Due(writes=(write(key),)), Writes(), lambda: False)
    assert done.progress is Progress.MORE
    assert queue.take() == ["b", "c"]
    assert queue.failures("b") == 0, "not a refusal: no backoff"


async def test_a_key_judged_with_nothing_to_write_comes_back_at_the_time_it_asked() -> None:
    clock = FakeClock()
    queue: KeyQueue[str] = KeyQueue(clock)
    queue.add_all(["due-later", "settled"])

    def judge(key: str) -> Due:
        return Due(again_in=30.0) if key == "due-later" else reconciler.NOTHING

    await reconcile(Server(), queue, judge, Writes(), lambda: False)
    clock.advance(29.0)
    assert queue.take() == []
    clock.advance(1.0)
    assert queue.take() == ["due-later"]


async def test_judging_stops_after_the_slice_and_the_rest_is_ready_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconciler, "SLICE", -1.0)  # over after each key's judgement
    queue: KeyQueue[str] = KeyQueue(FakeClock())
    queue.add_all(["a", "b", "c"])
    judged: list[str] = []

    def judge(key: str) -> Due:
        judged.append(key)
        return reconciler.NOTHING

    done = await reconcile(Server(), queue, judge, Writes(), lambda: False)
    assert judged == ["a"], "the slice was over after a"
    assert done.progress is Progress.MORE
    assert queue.take() == ["b", "c"]


async def test_a_pass_that_raises_leaves_every_key_it_took_ready_again() -> None:
    """The API server unwell mid-pass: no key is lost with the pass (the driver runs the lane again after its
    failure backoff)."""
    queue: KeyQueue[str] = KeyQueue(FakeClock())
    queue.add_all(["a", "b"])

    async def unwell(writes: Iterable[Write], record: Writes, *, stop: Callable[[], bool] | None = None) -> Sent:
        raise ConnectionError("the API server went away")

    with pytest.raises(ConnectionError):
        await reconcile(unwell, queue, lambda key: Due(writes=(write(key),)), Writes(), lambda: False)
    assert queue.take() == ["a", "b"]
