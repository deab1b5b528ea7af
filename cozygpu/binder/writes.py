"""Placement's writes: a pass's status writes, set by set, sent through the patcher.

Contract:
- Every status write is a merge patch of the ``status`` subresource whose
  ``metadata.resourceVersion`` is the version the decision was made on, so
  the server refuses it (409 Conflict) when the device changed since. Leader
  election does not fence; this precondition is what keeps a deposed leader,
  or a decision from a stale view, harmless (R-BIND-2).
- The members of a set are written one after another, each preconditioned,
  and so are the sets, but for a run of sets that each only take units
  (every member held none and is bound now: ``SetWrite.takes_only``): they
  free nothing a later set counted on, so their writes go out alongside
  each other (``Write.alongside``), and a burst of orders is not written one
  round trip at a time.
  A Conflict (or the device gone: 404) drops the rest of that set *and every
  set after it* (the patcher's ``OnRefusal.DROP_REST``): the pass is
  requeued (``Sent.requeue``), never retried blindly. The later sets were
  decided on a plan that counted the dropped set's action — units it would
  free on a node, budget it would release — so writing them anyway could
  book a node or a budget twice. Any other API error stops the whole run
  (the patcher raises it): the server is unwell and the next pass starts
  from a fresh view. Every write the server took before it is already
  recorded in the pass's ``Writes`` (assumed, when the caller assumes it)
  and handed to ``on_written``, so the caller still waits for the cache to
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

from collections.abc import Callable, Sequence

from cozygpu import keys
from cozygpu.api import devices
from cozygpu.base.logging import get_logger
from cozygpu.binder.patcher import OnRefusal, Sent, Write, send, version_of
from cozygpu.binder.status import DeviceWrite, SetWrite
from cozygpu.kube import Client, resource_path
from cozygpu.kube.client import Obj
from cozygpu.model.snapshot import DeviceKey
from cozygpu.passes.writes import Writes
from cozygpu.views import specs

log = get_logger(__name__)


def device_status_path(key: DeviceKey) -> str:
    return resource_path(keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL, namespace=key[0], name=key[1],
                         subresource="status")


def device_sends(sets: Sequence[SetWrite]) -> list[Write]:
    """The sets as the patcher's writes, in order: a merge patch of each device's ``status`` on the version
    its decision was made on; a refused one drops itself and every write after it (``tag``: the
    ``DeviceWrite``; ``what``: its set and device)."""
    return [Write(kind=specs.GPU_DEVICES, path=device_status_path(write.key), body={"status": write.status},
                  resource_version=write.resource_version, on_refusal=OnRefusal.DROP_REST,
                  alongside=device_set.takes_only, what=f"{device_set.label}: {'/'.join(write.key)}", tag=write)
            for device_set in sets for write in device_set.devices]


async def write_sets(client: Client, sets: Sequence[SetWrite], record: Writes, *,
                     assume: Callable[[Write, Obj], bool] | None = None,
                     on_written: Callable[[DeviceWrite, str], None] | None = None) -> Sent:
    """Send ``sets`` in order through the patcher (see the module contract); ``assume`` as ``patcher.send``
    takes it, ``on_written(write, resourceVersion)`` told of each device write the server took."""
    def written(write: Write, answer: Obj) -> None:
        device = write.tag
        assert isinstance(device, DeviceWrite)
        version = version_of(answer)
        log.info("device written", device=write.what, phase=devices.phase(answer), node=devices.node_name(answer),
                 answer=devices.answer_result(answer), resource_version=version)
        if on_written is not None:
            on_written(device, version)

    return await send(client, device_sends(sets), record, assume=assume, on_written=written)
