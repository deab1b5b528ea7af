"""One way for the binder's works to write: each write with its resourceVersion precondition, one policy
for a refusal, one result.

Every write that decides something carries the resourceVersion it was
decided on (leader election does not fence: a deposed leader's write fails
on the newer version). What a refusal means is the write's own ``OnRefusal``:

- ``REQUEUE``: the decision was made on a view no longer true; the work runs
  again from a fresh one (a finalizer, a detach, a usage record);
- ``IGNORE``: left to the next pass that finds it due (a report: the change
  that beat it is itself an event, which asks for one).

A refusal is a Conflict (someone wrote since), a NotFound (the object went;
``gone_is_done`` says when that is what the write was for, as a release is),
or an AlreadyExists (a create raced another). A Forbidden because the
namespace is being deleted is skipped: the object goes with it. Anything
else is an error and ends the run (the driver classifies it).

``send`` writes in order and stops between writes when ``stop()`` says so
(the work's slice is over: a lane before it waits): what was not sent is
``left``, for the work's next pass to plan again. Each accepted write's
resourceVersion is recorded in the pass's ``Writes`` for read-your-writes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

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
    #: What the log calls it, and whatever the work needs back from the result.
    what: str = ""
    tag: Any = None


@attrs.frozen
class Sent:
    """What ``send`` did: the writes the server took (with its answers), the ones it refused, and the
    ones not sent because the slice ended."""

    written: tuple[tuple[Write, Obj | None], ...] = ()
    refused: tuple[Write, ...] = ()
    left: tuple[Write, ...] = ()

    @property
    def requeue(self) -> bool:
        """Some write refused on a view no longer true: the work runs again from a fresh one."""
        return any(w.on_refusal is OnRefusal.REQUEUE for w in self.refused)

    @property
    def clean(self) -> bool:
        """Every write sent and taken (or, for ``IGNORE`` ones, let go)."""
        return not self.left and not self.requeue


def version_of(obj: Mapping[str, Any] | None) -> str:
    """An object's resourceVersion ("" when it has none)."""
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def _namespace_terminating(error: errors.Forbidden) -> bool:
    """The API server's refusal to create in a namespace being deleted (its NamespaceLifecycle admission)."""
    causes = {str(c.get("type") or c.get("reason") or "") for c in error.causes}
    return "NamespaceTerminating" in causes or "because it is being terminated" in error.message


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


async def send(client: Client, writes: Iterable[Write], record: Writes, *,
               stop: Callable[[], bool] = _never, assume: Callable[[Write, Obj], bool] | None = None) -> Sent:
    """Send ``writes`` in order (see the module docstring); never raises for a refusal. ``assume(write,
    answer)`` says whether the writer reads that answer back itself until the cache shows it: the write
    is then recorded as assumed."""
    written: list[tuple[Write, Obj | None]] = []
    refused: list[Write] = []
    queue = list(writes)
    for index, write in enumerate(queue):
        if index and stop():
            return Sent(tuple(written), tuple(refused), tuple(queue[index:]))
        try:
            answer = await _one(client, write)
        except errors.NotFound:
            if write.gone_is_done:
                written.append((write, None))
                continue
            refused.append(write)
            log.info("write refused", object=write.what or write.path, why="NotFound",
                     resource_version=write.resource_version, then=write.on_refusal.value)
            continue
        except (errors.Conflict, errors.AlreadyExists) as error:
            refused.append(write)
            log.info("write refused", object=write.what or write.path, why=type(error).__name__,
                     resource_version=write.resource_version, then=write.on_refusal.value)
            continue
        except errors.Forbidden as error:
            if not _namespace_terminating(error):
                raise
            log.info("write skipped: its namespace is being deleted", object=write.what or write.path)
            continue
        if answer.get("kind") == write.kind.kind:  # a delete answered with a Status removed it at once
            record.record(write.kind, version_of(answer), assumed=assume is not None and assume(write, answer))
            written.append((write, answer))
        else:
            written.append((write, None))
    return Sent(tuple(written), tuple(refused))
