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

from cozygpu import keys
from cozygpu.base.clock import Cancellable
from cozygpu.binder import attachments
from cozygpu.binder.assumed import StaleWrites, object_key
from cozygpu.binder.context import Context
from cozygpu.binder.cycle import Planned, plan_cycle
from cozygpu.binder.patcher import Write, version_of
from cozygpu.binder.reports import merge_conditions
from cozygpu.binder.status import plan_writes
from cozygpu.binder.writes import WriteReport, device_status_path, write_sets
from cozygpu.cache.store import Event
from cozygpu.kube.client import Obj
from cozygpu.model.placement import PassPlan
from cozygpu.model.snapshot import DeviceKey, Snapshot
from cozygpu.passes.writes import Writes
from cozygpu.views import specs

ATTACHMENT_VERIFIED: Final = "AttachmentVerified"


def unanswered(obj: Mapping[str, Any] | None) -> str:
    """The id of the device's unanswered bind request, or ""."""
    status = (obj or {}).get("status") or {}
    request = status.get("bindRequest") or {}
    answer = status.get("bindAnswer") or {}
    request_id = request.get("id") if isinstance(request, Mapping) else None
    if not request_id:
        return ""
    answered = answer.get("id") if isinstance(answer, Mapping) else None
    return "" if answered == request_id else str(request_id)


def new_order(obj: Mapping[str, Any]) -> bool:
    """A GPUDevice not accepted yet (no phase, or Pending) that carries no answer."""
    status = obj.get("status") or {}
    return (status.get("phase") or "Pending") == "Pending" and not status.get("bindAnswer")


def unverified(obj: Mapping[str, Any]) -> bool:
    """The device says its attachment cannot be verified (``AttachmentVerified=False``)."""
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(isinstance(c, Mapping) and c.get("type") == ATTACHMENT_VERIFIED and c.get("status") == "False"
               for c in conditions)


def verified_write(key: DeviceKey, obj: Obj, *, verified: bool, now: datetime) -> Write:
    """The ``AttachmentVerified`` condition of a device set to ``verified``, on its resourceVersion."""
    if verified:
        condition = {"type": ATTACHMENT_VERIFIED, "status": "True", "reason": "VMIKindServed",
                     "message": "virtualmachineinstances.kubevirt.io is served: the attachment is judged again"}
    else:
        condition = {"type": ATTACHMENT_VERIFIED, "status": "False", "reason": "VMIKindNotServed",
                     "message": "the device is attached and virtualmachineinstances.kubevirt.io is not served: "
                                "the binder cannot tell a running VM from a gone one, so it decides nothing "
                                "until the kind is served"}
    merged = merge_conditions((obj.get("status") or {}).get("conditions"), [condition], now)
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

    async def run(self, writes: Writes, *, lane: str = "placement") -> None:
        """One placement cycle: R-BIND-5 in order over the sets whose inputs changed since the last."""
        if not self._context.config.gpu_enabled:
            return
        snapshot, objects, served = self._context.snapshot()
        self._remind_window(snapshot.window_closes, snapshot.now)
        await self.verify_attachments(snapshot, objects, served, writes)
        # Now and then a plan over everything, whatever the view would keep.
        whole = self._planned is None or snapshot.now - self._whole_at >= self._context.config.whole_plan_every
        if whole:
            self._whole_at = snapshot.now
        last = None if whole else self._planned
        view, plan = plan_cycle(snapshot, last)
        self._planned = None  # until this cycle's writes are all done
        report = await self._write_plan(plan, view, objects, writes, lane=lane)
        if not report.requeue and report.error is None:
            self._planned = Planned.of(snapshot, view, plan, last)
        if report.error is not None:
            raise report.error
        if report.dropped:
            raise StaleWrites(len(report.dropped))

    async def _write_plan(self, plan: PassPlan, snapshot: Snapshot, objects: Mapping[DeviceKey, Obj],
                          writes: Writes, *, lane: str) -> WriteReport:
        context = self._context
        sets = plan_writes(plan, snapshot, objects, now=snapshot.now)
        report = await write_sets(context.client, sets,
                                  on_written=lambda write, version: context.events.record(write, version,
                                                                                          now=snapshot.now))
        for item in report.written:
            # Assumed: read back by the next cycle, which need not wait for the watch to show it.
            context.assumed.add(item.key, item.answer)
            context.live.changed(keys.GPUDEVICE_KIND, None, item.answer)
            writes.record(specs.GPU_DEVICES, item.resource_version, assumed=True)
        self._count(plan, report, lane)
        if report.dropped and context.metrics is not None:
            context.metrics.conflicts.inc(len(report.dropped))
        return report

    def _count(self, plan: PassPlan, report: WriteReport, lane: str) -> None:
        answered = {w.key for w in report.written}
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
                metrics.decisions.labels(lane=lane, action=type(action).__name__).inc()

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
