"""One way for the binder's works to write: each write with its resourceVersion precondition, one policy
for a refusal, one result.

Every write that decides something carries the resourceVersion it was
decided on (leader election does not fence: a deposed leader's write fails
on the newer version). What a refusal means is the write's own ``OnRefusal``:

- ``REQUEUE``: the decision was made on a view no longer true; the work runs
  again from a fresh one (a finalizer, a detach, a usage record);
- ``IGNORE``: left to the next pass that finds it due (a report: the change
  that beat it is itself an event, which asks for one);
- ``DROP_REST``: as ``REQUEUE``, and every write after it is dropped, not
  sent (``Sent.dropped``): the write is one of a plan whose later writes
  counted on it (placement: units a set would free, budget it would
  release), so sending them anyway could book a node or a budget twice.

A refusal is a Conflict (someone wrote since), a NotFound (the object went;
``gone_is_done`` says when that is what the write was for, as a release is),
or an AlreadyExists (a create raced another). A Forbidden because the
namespace is being deleted is skipped: the object goes with it. Anything
else is an error and ends the run (the driver classifies it).

``send`` writes in order and stops between writes when ``stop()`` says so
(the work's slice is over: a lane before it waits): what was not sent is
``left``, for the work's next pass to plan again. Each accepted write's
resourceVersion is recorded in the pass's ``Writes`` for read-your-writes,
and handed to ``on_written`` with the object the server stored. A run of
writes marked ``alongside`` (each frees nothing a later write counts on)
goes out at once, at most ``ALONGSIDE`` in flight: a refusal among them drops
what comes after the run; an error is raised once every write of the run has
its answer (what the server took is recorded first).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Final

import attrs

from cozygpu.api import apistatus, meta
from cozygpu.base.logging import get_logger
from cozygpu.cache.kinds import KindSpec
from cozygpu.kube import Client, errors
from cozygpu.kube.client import Obj
from cozygpu.passes.writes import Writes

log = get_logger("cozygpu.binder.patcher")


class Verb(enum.Enum):
    PATCH = "patch"  # a JSON merge patch
    PUT = "put"
    CREATE = "create"
    DELETE = "delete"


class OnRefusal(enum.Enum):
    REQUEUE = "requeue"
    IGNORE = "ignore"
    DROP_REST = "drop the rest"


@attrs.frozen(kw_only=True)
class Write:
    """One write of a work: ``body`` is the patch, the object to put or create, or None for a delete."""

    kind: KindSpec
    path: str
    verb: Verb = Verb.PATCH
    body: Mapping[str, Any] | None = None
    #: The precondition ("" or None: none, for a create).
    resource_version: str | None = None
    on_refusal: OnRefusal = OnRefusal.REQUEUE
    #: A NotFound is what the write was for (a release of an object already gone): done, not refused.
    gone_is_done: bool = False
    #: It frees nothing a later write counts on: sent alongside the writes next to it that say the same.
    alongside: bool = False
    #: What the log calls it, and whatever the work needs back from the result.
    what: str = ""
    tag: Any = None


@attrs.frozen
class Sent:
    """What ``send`` did: the writes the server took (with its answers), the ones it refused, the ones
    not sent because the slice ended, and those dropped after a ``DROP_REST`` refusal."""

    written: tuple[tuple[Write, Obj | None], ...] = ()
    refused: tuple[Write, ...] = ()
    left: tuple[Write, ...] = ()
    dropped: tuple[Write, ...] = ()

    @property
    def requeue(self) -> bool:
        """Some write refused on a view no longer true: the work runs again from a fresh one."""
        return any(w.on_refusal is not OnRefusal.IGNORE for w in self.refused)

    @property
    def clean(self) -> bool:
        """Every write sent and taken (or, for ``IGNORE`` ones, let go)."""
        return not self.left and not self.dropped and not self.requeue


def version_of(obj: Mapping[str, Any] | None) -> str:
    """An object's resourceVersion ("" when it has none)."""
    return meta.resource_version(obj)


def _namespace_terminating(error: errors.Forbidden) -> bool:
    """The API server's refusal to create in a namespace being deleted (its NamespaceLifecycle admission)."""
    return "NamespaceTerminating" in apistatus.cause_kinds(error.causes) or \
        "because it is being terminated" in error.message


async def _one(client: Client, write: Write) -> Obj:
    version = write.resource_version or None
    body = dict(write.body or {})
    if write.verb is Verb.PATCH:
        return await client.merge_patch(write.path, body, resource_version=version)
    if write.verb is Verb.PUT:
        return await client.replace(write.path, body)
    if write.verb is Verb.CREATE:
        return await client.create(write.path, body)
    return await client.delete(write.path, resource_version=version)


def _never() -> bool:
    return False


#: Writes ``alongside`` each other in flight at once, at most.
ALONGSIDE: Final = 16


@attrs.define
class _Outcome:
    """One write's result: the server's answer (None: nothing to keep), or why it was refused, or skipped."""

    answer: Obj | None = None
    refused: str | None = None
    skipped: bool = False


async def send(client: Client, writes: Iterable[Write], record: Writes, *,
               stop: Callable[[], bool] = _never, assume: Callable[[Write, Obj], bool] | None = None,
               on_written: Callable[[Write, Obj], None] | None = None) -> Sent:
    """Send ``writes`` in order (see the module docstring); never raises for a refusal. ``assume(write,
    answer)`` says whether the writer reads that answer back itself until the cache shows it: the write
    is then recorded as assumed. ``on_written(write, answer)`` is told of each write the server took,
    with the object it stored, as soon as it did."""
    written: list[tuple[Write, Obj | None]] = []
    refused: list[Write] = []
    queue = list(writes)

    async def one(write: Write) -> _Outcome:
        try:
            answer = await _one(client, write)
        except errors.NotFound:
            if write.gone_is_done:
                return _Outcome()
            return _Outcome(refused="NotFound")
        except (errors.Conflict, errors.AlreadyExists) as error:
            return _Outcome(refused=type(error).__name__)
        except errors.Forbidden as error:
            if not _namespace_terminating(error):
                raise
            log.info("write skipped: its namespace is being deleted", object=write.what or write.path)
            return _Outcome(skipped=True)
        if meta.kind(answer) != write.kind.kind:  # a delete answered with a Status removed it at once
            return _Outcome()
        record.record(write.kind, version_of(answer), assumed=assume is not None and assume(write, answer))
        if on_written is not None:
            on_written(write, answer)
        return _Outcome(answer=answer)

    index = 0
    while index < len(queue):
        if index and stop():
            return Sent(tuple(written), tuple(refused), tuple(queue[index:]))
        end = index + 1
        while queue[index].alongside and end < len(queue) and queue[end].alongside and end - index < ALONGSIDE:
            end += 1
        run = queue[index:end]
        outcomes = await _together(one, run)
        dropping = False
        for write, outcome in zip(run, outcomes, strict=True):
            if outcome.skipped:
                continue
            if outcome.refused is None:
                written.append((write, outcome.answer))
                continue
            refused.append(write)
            log.info("write refused", object=write.what or write.path, why=outcome.refused,
                     resource_version=write.resource_version, then=write.on_refusal.value)
            dropping = dropping or write.on_refusal is OnRefusal.DROP_REST
        index = end
        if dropping:
            rest = tuple(queue[index:])
            if rest:
                log.info("later writes of the plan not sent, requeued", writes=len(rest))
            return Sent(tuple(written), tuple(refused), dropped=rest)
    return Sent(tuple(written), tuple(refused))


async def _together(one: Callable[[Write], Coroutine[Any, Any, _Outcome]], run: list[Write]) -> list[_Outcome]:
    """``one`` of each write of ``run`` at once, their outcomes in ``run``'s order. Each runs to its end, so
    every write the server took is recorded; then an error that is no refusal is raised (the first in order)."""
    results = await asyncio.gather(*(one(write) for write in run), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [result for result in results if isinstance(result, _Outcome)]
