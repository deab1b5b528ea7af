"""The one writer of placement: sends a pass's status writes, set by set.

Contract:
- Every status write is a merge patch of the ``status`` subresource whose
  ``metadata.resourceVersion`` is the version the decision was made on, so
  the server refuses it (409 Conflict) when the device changed since. Leader
  election does not fence; this precondition is what keeps a deposed leader,
  or a decision from a stale view, harmless (R-BIND-2).
- The members of a set are written one after another, each preconditioned.
  A Conflict (or the device gone: 404) drops the rest of that set *and every
  set after it*, is logged and reported as ``requeue``; it is never retried
  blindly. The later sets were decided on a plan that counted the dropped
  set's action — units it would free on a node, budget it would release —
  so writing them anyway could book a node or a budget twice. Any other
  API error stops the whole run: the server is unwell and the next pass
  starts from a fresh view. It is reported as ``error`` rather than raised,
  so the caller still learns what was written and can wait for the cache to
  see it before the next pass decides.
- A set written half way is safe (R-BIND-4): each member's patch is a whole
  state of its own (Bound on a node, or Lost, with its answer), so a member
  never claims a node it does not hold and no unit is counted twice. What is
  left is a split or partly Lost set, or members still Pending beside held
  ones, and the first step of the next pass (``_restore_sets``) gathers the
  set onto one node or sends it to Lost whole, while unanswered requests are
  answered from that restored state.
- Events are not sent here: each device's write that succeeded is handed
  to ``on_written`` (the binder's ``EventRecorder`` queues its Events, sent
  off the placement path), so a status patch is the one write on an
  order's path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs

from cozygpu import keys
from cozygpu.base.logging import get_logger
from cozygpu.binder.status import DeviceWrite, SetWrite
from cozygpu.cache.informer import resource_version_at_least
from cozygpu.kube import Client, errors, resource_path
from cozygpu.kube.client import Obj
from cozygpu.model.snapshot import DeviceKey

log = get_logger(__name__)

@attrs.frozen(kw_only=True)
class Written:
    key: DeviceKey
    #: The resourceVersion the server gave the write: what the cache must see before the next pass.
    resource_version: str
    #: The device as the server stored it (the binder reads it back until its cache shows it).
    answer: Obj = attrs.field(factory=dict, eq=False, repr=False)


@attrs.frozen(kw_only=True)
class Dropped:
    label: str
    key: DeviceKey
    why: str


@attrs.frozen(kw_only=True)
class WriteReport:
    written: tuple[Written, ...] = ()
    #: Sets whose action was dropped on a Conflict or a vanished device.
    dropped: tuple[Dropped, ...] = ()
    #: An error that stopped the run (not a Conflict); the caller raises it after waiting for ``written``.
    error: errors.KubeError | None = None
    #: Sets never tried: ``error`` stopped the run, or an earlier set was dropped.
    skipped: tuple[str, ...] = ()

    @property
    def requeue(self) -> bool:
        """The pass must run again from a fresh view."""
        return bool(self.dropped or self.skipped) or self.error is not None

    @property
    def latest_resource_version(self) -> str | None:
        """The newest resourceVersion written (integers compared as such), or None."""
        latest: str | None = None
        for item in self.written:
            if latest is None or resource_version_at_least(item.resource_version, latest):
                latest = item.resource_version
        return latest


def device_status_path(key: DeviceKey) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=key[0], name=key[1],
                         subresource="status")


async def write_sets(client: Client, sets: Sequence[SetWrite], *,
                     on_written: Callable[[DeviceWrite, str], None] | None = None) -> WriteReport:
    """Send ``sets`` in order (see the module contract) and report what was written and what was dropped."""
    written: list[Written] = []
    dropped: list[Dropped] = []
    for index, device_set in enumerate(sets):
        for write in device_set.devices:
            try:
                answer = await client.merge_patch(device_status_path(write.key), {"status": dict(write.status)},
                                                  resource_version=write.resource_version)
            except (errors.Conflict, errors.NotFound) as error:
                why = "conflict" if isinstance(error, errors.Conflict) else "gone"
                log.info("set dropped, requeued", set=device_set.label, device="/".join(write.key), why=why,
                         resource_version=write.resource_version)
                dropped.append(Dropped(label=device_set.label, key=write.key, why=why))
                rest = _labels(sets[index + 1:])
                if rest:
                    log.info("later sets of the pass not written, requeued", sets=len(rest))
                return WriteReport(written=tuple(written), dropped=tuple(dropped), skipped=rest)
            except errors.KubeError as error:
                log.warning("writes stopped", set=device_set.label, device="/".join(write.key), error=str(error))
                return WriteReport(written=tuple(written), dropped=tuple(dropped), error=error,
                                   skipped=_labels(sets[index:]))
            version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
            written.append(Written(key=write.key, resource_version=version, answer=answer))
            log.info("device written", set=device_set.label, device="/".join(write.key),
                     phase=write.status.get("phase"), node=write.status.get("nodeName"),
                     answer=(write.status.get("bindAnswer") or {}).get("result"), resource_version=version)
            if on_written is not None:
                on_written(write, version)
    return WriteReport(written=tuple(written), dropped=tuple(dropped))


def _labels(sets: Iterable[SetWrite]) -> tuple[str, ...]:
    return tuple(s.label for s in sets)
