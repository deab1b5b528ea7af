"""The placement work: one placement cycle per pass (R-BIND-1…7), first on the driver.

A pass is R-BIND-5 in order (restore sets, move, rebind Lost, answer, bind
new orders) over only the sets whose inputs changed since the last cycle
(``cycle.plan_cycle``), and now and then (``whole_plan_every``) over every
set. A bind request or a new order asks for a pass the moment it is seen
(``on_request``), so it is decided in the very next cycle (R-BIND-3); a
change the world makes asks for one through the driver's trigger.

No decision from a stale view (R-BIND-2): every placement write the server
takes is assumed (``Assumed``) — read back by the read model and the next
cycle until the cache shows it — so the next cycle never waits for the
watch, nor for the housekeeping works' writes (their writes and ours carry
the resourceVersion they were decided on, so a write decided on a view that
missed a change is refused with a Conflict and the pass requeues).

R-BIND-7: while a device is attached and the VMI kind is not served, the
binder cannot tell a running VM from an absent one, so a pass fails before
deciding anything (``AttachmentsUnverified``) and the devices carry an
``AttachmentVerified=False`` condition saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from cozygpu.api.conditions import Condition, merge, of
from cozygpu.api.devices import condition_status, new_order, unanswered
from cozygpu.base.clock import Cancellable
from cozygpu.binder import attachments
from cozygpu.binder.assumed import StaleWrites, object_key
from cozygpu.binder.context import Context
from cozygpu.binder.cycle import Planned, plan_cycle
from cozygpu.binder.patcher import Sent, Write, version_of
from cozygpu.binder.status import DeviceWrite, plan_writes
from cozygpu.binder.writes import device_status_path, write_sets
from cozygpu.cache.store import Event
from cozygpu.kube import errors
from cozygpu.kube.client import Obj
from cozygpu.model.placement import Bind, PassPlan
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import DeviceKey, Snapshot
from cozygpu.passes.writes import Writes
from cozygpu.views import specs

ATTACHMENT_VERIFIED: Final = "AttachmentVerified"
#: The ``status`` of a condition that is False.
FALSE: Final = "False"


def unverified(obj: Mapping[str, Any]) -> bool:
    """The device says its attachment cannot be verified (``AttachmentVerified=False``)."""
    return condition_status(obj, ATTACHMENT_VERIFIED) == FALSE


def verified_write(key: DeviceKey, obj: Obj, *, verified: bool, now: datetime) -> Write:
    """The ``AttachmentVerified`` condition of a device set to ``verified``, on its resourceVersion."""
    if verified:
        condition = Condition(ATTACHMENT_VERIFIED, True, "VMIKindServed",
                              "virtualmachineinstances.kubevirt.io is served: the attachment is judged again")
    else:
        condition = Condition(ATTACHMENT_VERIFIED, False, "VMIKindNotServed",
                              "the device is attached and virtualmachineinstances.kubevirt.io is not served: "
                              "the binder cannot tell a running VM from a gone one, so it decides nothing "
                              "until the kind is served")
    merged = merge(of(obj), [condition], now)
    return Write(kind=specs.GPU_DEVICES, path=device_status_path(key), body={"status": {"conditions": merged}},
                 resource_version=version_of(obj), what="/".join(key), tag=key)


class PlacementWork:
    """Placement cycles (see the module docstring); ``device_changed`` is fed every GPUDevice event."""

    def __init__(self, context: Context) -> None:
        self._context = context
        #: The last placement cycle whose writes were all done: what the next one's view is taken against.
        self._planned: Planned | None = None
        self._whole_at = datetime.min.replace(tzinfo=UTC)
        #: Unanswered bind requests: id -> when this replica first saw it (answer latency).
        self._requests: dict[tuple[DeviceKey, str], float] = {}
        self._on_request: Callable[[], None] | None = None
        #: The pass asked for when the first open launcher window closes, and when that is.
        self._window_reminder: tuple[datetime, Cancellable] | None = None
        self._on_window_closed: Callable[[], None] | None = None

    @property
    def noted_requests(self) -> int:
        """Unanswered bind requests this term noted (for answer latency); none outside a term."""
        return len(self._requests)

    def on_request(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever a device carries a new unanswered request or a new order appears."""
        self._on_request = callback

    def on_window_closed(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the first launcher window closes: its pod's GPUs may take a hold then."""
        self._on_window_closed = callback

    def started(self, devices: Sequence[Obj]) -> None:
        """A term starts over ``devices``: one pass answers any request caught before it."""
        if self._on_request is not None and self._context.config.gpu_enabled and any(unanswered(o) for o in devices):
            self._on_request()

    def stopped(self) -> None:
        """The term ended: nothing of it is kept (a follower keeps no requests, no plan, no reminder)."""
        self._planned, self._requests = None, {}
        self._whole_at = datetime.min.replace(tzinfo=UTC)
        if self._window_reminder is not None:
            self._window_reminder[1].cancel()
            self._window_reminder = None

    def device_changed(self, event: Event) -> None:
        request_id = unanswered(event.obj) if event.type != "DELETED" else ""
        if request_id and request_id != unanswered(event.old):
            self._requests.setdefault((object_key(event.obj), request_id), self._context.clock.now())
        elif not (event.old is None and new_order(event.obj)):
            return  # neither a new request nor a new order: nothing for the very next cycle
        if self._on_request is not None and self._context.config.gpu_enabled:
            self._on_request()

    # -- a pass -------------------------------------------------------------------------------

    async def run(self, writes: Writes) -> None:
        """One placement cycle: R-BIND-5 in order over the sets whose inputs changed since the last."""
        if not self._context.config.gpu_enabled:
            return
        snapshot, objects, served = await self._context.snapshot()
        self._remind_window(snapshot.window_closes, snapshot.now)
        await self.verify_attachments(snapshot, objects, served, writes)
        # Now and then a plan over everything, whatever the view would keep.
        whole = self._planned is None or snapshot.now - self._whole_at >= self._context.config.whole_plan_every
        if whole:
            self._whole_at = snapshot.now
        last = None if whole else self._planned
        view, plan = plan_cycle(snapshot, last)
        self._planned = None  # until this cycle's writes are all done
        sent = await self._write_plan(plan, view, objects, writes)
        if sent.requeue:
            raise StaleWrites(len(sent.refused))
        self._planned = Planned.of(snapshot, view, plan, last)

    async def _write_plan(self, plan: PassPlan, snapshot: Snapshot, objects: Mapping[DeviceKey, Obj],
                          writes: Writes) -> Sent:
        """Write the plan through the patcher: each device the server took is assumed (read back by the
        next cycle, which need not wait for the watch to show it) and its Events queued at once; a refusal
        drops the rest of the plan. The pass is counted even when an API error stops the writes."""
        context = self._context
        sets = plan_writes(plan, snapshot, objects, now=snapshot.now)
        answered: set[DeviceKey] = set()

        def written(write: DeviceWrite, version: str) -> None:
            answered.add(write.key)
            context.events.record(write, version, now=snapshot.now)

        try:
            sent = await write_sets(context.client, sets, writes, assume=context.assume, on_written=written)
        except errors.KubeError:
            self._count(plan, answered)  # the server is unwell: what it took still counts
            raise
        self._count(plan, answered)
        if sent.refused and context.metrics is not None:
            context.metrics.conflicts.inc(len(sent.refused))
        return sent

    def _count(self, plan: PassPlan, answered: set[DeviceKey]) -> None:
        now = self._context.clock.now()
        metrics = self._context.metrics
        store = self._context.cache.store(specs.GPU_DEVICES)
        for (key, request_id), seen in list(self._requests.items()):
            obj = store.get(*key)
            if key in answered or obj is None or unanswered(obj) != request_id:
                del self._requests[(key, request_id)]
                if key in answered and metrics is not None:
                    metrics.answer_latency.observe(now - seen)
        if metrics is not None:
            for action in plan.actions:
                metrics.decisions.labels(lane="placement", action=type(action).__name__).inc()
                if isinstance(action, Bind) and action.cause is not None and action.cause.reason is Reason.COMPACTION:
                    metrics.compaction_moves.inc()

    async def verify_attachments(self, snapshot: Snapshot, objects: Mapping[DeviceKey, Obj], served: bool,
                                 writes: Writes) -> None:
        """R-BIND-7: fail the pass, and say so on the devices, while attachments cannot be verified."""
        if served:
            return  # every attachment can be judged (what to detach is the attachment work's, R-BIND-8)
        plan = attachments.plan_attachments(snapshot, vmis_served=served,
                                            grace=self._context.config.attachment_grace)
        if not plan.unverified:
            return
        await self._context.send([verified_write(key, objects[key], verified=False, now=snapshot.now)
                                          for key in plan.unverified if not unverified(objects[key])], writes)
        raise attachments.AttachmentsUnverified(plan.unverified)

    def _remind_window(self, closes: datetime | None, now: datetime) -> None:
        """Ask for a pass when the first launcher window closes: its pod's GPUs may take a hold then."""
        if closes is None or (self._window_reminder is not None and self._window_reminder[0] <= closes):
            return
        if self._window_reminder is not None:
            self._window_reminder[1].cancel()
        delay = max((closes - now).total_seconds(), 0.0)
        self._window_reminder = (closes, self._context.clock.call_later(delay, self._window_closed))

    def _window_closed(self) -> None:
        self._window_reminder = None
        if self._on_window_closed is not None:
            self._on_window_closed()
