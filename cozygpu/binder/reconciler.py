"""A housekeeping work as controller-runtime's controller: a queue of keys, each reconciled on its own.

A work's events (the read model's change log, or the cache's events of a
kind it reads) add keys to its ``KeyQueue``; a pass takes the keys ready,
judges each against one snapshot (``judge``: the key's writes, and when it
must be looked at again whatever happens), sends the writes, and settles
each key by what the API server did with its own writes:

- all taken, or none to make: ``forget`` (its backoff starts over), and
  ready again at the time the judgement gave, if any;
- one refused (a Conflict, a NotFound, a write dropped after a refusal):
  ``retry``: ready again after its own backoff, which doubles each time;
- one not sent because a lane before this one came due (``stop``): ready
  again at once, for the next pass;
- the pass raised (the API server unwell): every key it took is ready again,
  and the driver runs the lane after its failure backoff.

Judging stops after ``SLICE`` seconds; the keys not judged are ready again
at once and the pass says ``Progress.MORE`` (a term's first pass judges
every object, and the event loop must not wait behind all of them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Final, Generic, Protocol, TypeVar

import attrs

from cozygpu.binder.patcher import Sent, Write
from cozygpu.model.snapshot import Changes, DeviceKey, Snapshot
from cozygpu.passes.driver import Progress
from cozygpu.passes.keyed import KeyQueue
from cozygpu.passes.writes import Writes

K = TypeVar("K", bound=Hashable)

#: Seconds of judging a pass does before it writes what it found (about 100 holds or GPUNodes).
SLICE: Final = 0.005


@attrs.frozen
class Due:
    """One key's judgement: its writes, in order, and in how many seconds to look at it again (None: when
    an event says so)."""

    writes: Sequence[Write] = ()
    again_in: float | None = None


NOTHING: Final = Due()


@attrs.frozen
class Reconciled(Generic[K]):
    """A pass's keys and writes: ``sent`` (the patcher's result) and each write's key."""

    sent: Sent
    progress: Progress


class Send(Protocol):
    """``Context.send``: the patcher's ``send`` through the binder's client."""

    async def __call__(self, writes: Iterable[Write], record: Writes, *, stop: Callable[[], bool] | None = None
                       ) -> Sent: ...


async def reconcile(send: Send, queue: KeyQueue[K], judge: Callable[[K], Due], writes: Writes,
                    stop: Callable[[], bool]) -> Reconciled[K]:
    """One pass over the keys ready in ``queue`` (see the module docstring)."""
    keys = queue.take()
    try:
        return await _reconcile(send, queue, keys, judge, writes, stop)
    except BaseException:
        queue.add_all(keys)  # nothing settled: every key taken is ready again (the driver backs the lane off)
        raise


async def _reconcile(send: Send, queue: KeyQueue[K], keys: list[K], judge: Callable[[K], Due], writes: Writes,
                     stop: Callable[[], bool]) -> Reconciled[K]:
    judged: dict[K, Due] = {}
    started = time.perf_counter()
    judged_all = True
    for at, key in enumerate(keys):
        judged[key] = judge(key)
        if time.perf_counter() - started > SLICE and at + 1 < len(keys):
            queue.add_all(keys[at + 1:])
            judged_all = False
            break
    owner: dict[int, K] = {}
    planned: list[Write] = []
    for key, verdict in judged.items():
        for write in verdict.writes:
            owner[id(write)] = key
            planned.append(write)
    sent = await send(planned, writes, stop=stop)
    retried: set[K] = set()
    for write in (*sent.refused, *sent.dropped):
        key = owner[id(write)]
        if key not in retried:
            retried.add(key)
            queue.retry(key)
    left = [key for key in dict.fromkeys(owner[id(write)] for write in sent.left) if key not in retried]
    queue.add_all(left)  # in the order they were judged
    unsettled = retried.union(left)
    for key, verdict in judged.items():
        if key in unsettled:
            continue
        queue.forget(key)
        if verdict.again_in is not None:
            queue.add_after(key, verdict.again_in)
    more = bool(left) or not judged_all
    return Reconciled(sent, Progress.MORE if more else Progress.DONE)


class ChangeFeed:
    """The read model's change log as one work follows it: what changed since the snapshot it last read."""

    def __init__(self) -> None:
        self._last: Snapshot | None = None

    def since(self, snapshot: Snapshot) -> Changes | None:
        """What changed since the last call's snapshot; None: anything may have (a first call, a rebuild)."""
        changes = snapshot.changes_since(self._last) if self._last is not None else None
        self._last = snapshot
        return changes

    def forget(self) -> None:
        self._last = None


def devices_touched(snapshot: Snapshot, changes: Changes) -> set[DeviceKey]:
    """The devices the change log names, and those attached to the VMIs it names (a VMI's launcher pods,
    and the pods that claim it, are logged as the VMI)."""
    by_vmi = snapshot.devices_by_vmi
    return set(changes.devices) | {key for vmi in changes.vmis for key in by_vmi.get(vmi, ())}
