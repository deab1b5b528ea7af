"""``KeyQueue``: each key once, ready now or later, and a backoff of its own after a refusal."""

from __future__ import annotations

from cozygpu.base.clock import FakeClock
from cozygpu.passes.keyed import KeyQueue


def test_a_key_added_many_times_is_taken_once_in_the_order_keys_became_ready() -> None:
    queue: KeyQueue[str] = KeyQueue(FakeClock())
    for key in ("b", "a", "b", "c", "a"):
        queue.add(key)
    assert queue.take() == ["b", "a", "c"]
    assert queue.take() == []
    queue.add("a")  # added again after it was taken (its event came while it was judged): ready for the next
    assert queue.take() == ["a"]


def test_a_key_for_later_is_ready_then_and_asks_for_a_pass_once() -> None:
    clock = FakeClock()
    queue: KeyQueue[str] = KeyQueue(clock)
    asked: list[float] = []
    queue.on_ready(lambda: asked.append(clock.now()))
    queue.add_after("late", 10.0)
    queue.add_after("soon", 2.0)
    queue.add_after("soon", 5.0)  # a later time for a key already due sooner changes nothing
    assert "late" in queue
    assert queue.take() == []
    clock.advance(2.0)
    assert asked == [2.0]
    assert queue.take() == ["soon"]
    clock.advance(8.0)
    assert asked == [2.0, 10.0]
    assert queue.take() == ["late"]
    assert len(queue) == 0


def test_a_key_ready_now_is_not_put_off_and_one_made_ready_now_leaves_its_later_time() -> None:
    clock = FakeClock()
    queue: KeyQueue[str] = KeyQueue(clock)
    queue.add("k")
    queue.add_after("k", 5.0)
    assert queue.take() == ["k"]
    queue.add_after("j", 5.0)
    queue.add("j")
    assert queue.take() == ["j"]
    clock.advance(5.0)
    assert queue.take() == [], "its later time was dropped when it became ready"


def test_each_refusal_doubles_that_keys_wait_and_a_success_starts_it_over() -> None:
    clock = FakeClock()
    queue: KeyQueue[str] = KeyQueue(clock, base=1.0, cap=4.0)
    waits = [queue.retry("k") for _ in range(4)]
    assert waits == [1.0, 2.0, 4.0, 4.0], "doubling, up to the cap"
    assert queue.failures("k") == 4
    queue.add("other")
    assert queue.take() == ["other"], "a key in backoff holds up no other key"
    clock.advance(1.0)
    assert queue.take() == ["k"], "ready at its first retry's time (the earliest asked)"
    queue.forget("k")
    assert queue.retry("k") == 1.0


def test_clear_forgets_everything_and_no_reminder_fires_after() -> None:
    clock = FakeClock()
    queue: KeyQueue[str] = KeyQueue(clock)
    asked: list[float] = []
    queue.on_ready(lambda: asked.append(clock.now()))
    queue.add("a")
    queue.add_after("b", 3.0)
    queue.retry("c")
    queue.clear()
    clock.advance(10.0)
    assert asked == []
    assert queue.take() == []
    assert queue.failures("c") == 0
