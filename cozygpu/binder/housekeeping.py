"""The binder's housekeeping works, each a lane of its own on the driver after placement.

- ``ClaimsWork``: the hold claims of DRA-sourced devices (SPEC §1.5), right
  after placement: a VM start waits for its claim's allocation;
- ``AttachmentsWork``: attachments whose VMI is gone or never came, UIDs to
  adopt (R-BIND-8), and ``AttachmentVerified`` back to True once VMIs are
  served (R-BIND-7);
- ``LedgerWork``: each hold's ledger and its class's idle-hold rule
  (R-LEDGER-1, R-LEDGER-2), judged for the holds whose device or VMI moved
  and at each hold's next deadline;
- ``FinalizersWork``: device and class finalizers (R-BIND-9);
- ``UsageWork``: Cozystack usage records (R-BIND-9);
- ``ReportsWork``: GPUClass status and GPUNode conditions (R-BIND-10), paced
  by ``report_every`` and ``reports_per_pass``;
- ``VerifyWork``: the safety net, the read model checked against a build
  from the stores every ``verify_every``.

Each writes through the patcher (``patcher.send``) and stops between writes
when the driver says a lane before it is due (``stop``): it then answers
``Progress.MORE`` and its next pass plans again from a fresh view, so a bind
request waits behind one write of housekeeping, never behind all of it. A
write refused on its resourceVersion requeues the work (``StaleWrites``),
except a report's, which the next report pass makes again if still due.
Each decides on what moved only (the incremental watches of its module), so
a pass asked for by an unrelated event costs next to nothing.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

from cozygpu.api import meta
from cozygpu.base.clock import Cancellable
from cozygpu.base.logging import get_logger
from cozygpu.binder import attachments, claims, finalizers, ledger, reports, usage
from cozygpu.binder.assumed import StaleWrites, object_key
from cozygpu.binder.context import Context, optional
from cozygpu.binder.patcher import Sent, Write
from cozygpu.binder.place import unverified, verified_write
from cozygpu.binder.status import DeviceWrite
from cozygpu.binder.writes import device_status_path
from cozygpu.cache.errors import KindNotServed
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.store import Event
from cozygpu.kube.client import Obj
from cozygpu.model import ledger as ledger_model
from cozygpu.model.snapshot import DeviceKey, Snapshot
from cozygpu.passes.driver import Progress
from cozygpu.passes.writes import Writes
from cozygpu.views import specs

log = get_logger("cozygpu.binder")

#: Stops a pass between two writes when true (the driver: a lane before this one is due).
Stop = Callable[[], bool]


def _never() -> bool:
    return False


def _settle(sent: Sent) -> Progress:
    """The pass's answer once ``sent``: requeued when a write was refused on a stale view, MORE when its
    slice ended first."""
    if sent.requeue:
        raise StaleWrites(len(sent.refused))
    return Progress.MORE if sent.left else Progress.DONE


class _StoreVersions:
    """The stores a work reads, by identity and resourceVersion: unchanged since a clean run, nothing to do."""

    def __init__(self, context: Context, kinds: Sequence[KindSpec]) -> None:
        self._context = context
        self._kinds = tuple(kinds)
        self.clean: tuple[object, ...] | None = None

    def now(self) -> tuple[object, ...]:
        found: list[object] = []
        for spec in self._kinds:
            try:
                store = self._context.cache.store(spec)
            except KindNotServed:
                found += [None, None]
                continue
            found += [store, store.resource_version]
        return tuple(found)

    def replaced(self, now: tuple[object, ...]) -> bool:
        """A first run, or a store replaced since the last clean one: no event says what moved."""
        return self.clean is None or now[0::2] != self.clean[0::2]


class AttachmentsWork:
    def __init__(self, context: Context) -> None:
        self._context = context
        self._watch = attachments.AttachmentWatch()
        #: When the binder first saw an attachment that carries no time (R-BIND-8's grace starts then).
        self._first_seen: dict[DeviceKey, datetime] = {}
        #: Devices whose ``AttachmentVerified`` is False, kept from the device events (no scan of every device).
        self._unverified: set[DeviceKey] = set()

    def started(self, devices: Iterable[Obj]) -> None:
        self._unverified = {object_key(obj) for obj in devices if unverified(obj)}

    def stopped(self) -> None:
        self._watch, self._first_seen, self._unverified = attachments.AttachmentWatch(), {}, set()

    def device_changed(self, event: Event) -> None:
        if event.type != "DELETED" and unverified(event.obj):
            self._unverified.add(object_key(event.obj))
        else:
            self._unverified.discard(object_key(event.obj))

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        if not context.config.gpu_enabled:
            return Progress.DONE
        snapshot, objects, served = await context.snapshot()
        if not served:
            return Progress.DONE  # nothing can be judged: the placement work says so on the devices (R-BIND-7)
        # Only the attached devices whose verdict may have moved (the rest are settled: see attachments).
        judged = attachments.attached_devices(snapshot, self._watch.candidates(snapshot))
        for device in judged:
            if device.attachment is not None and device.attachment.attached_at is None:
                self._first_seen.setdefault(device.key, snapshot.now)
        for key in [k for k in self._first_seen if (d := snapshot.devices.get(k)) is None or d.attachment is None]:
            del self._first_seen[key]
        plan = attachments.plan_attachments(snapshot, vmis_served=True, grace=context.config.attachment_grace,
                                            first_seen=self._first_seen, attached=judged)
        self._watch.judged(snapshot, judged, plan, (), clean=False)  # until its writes are done
        done = {*(d.device for d in plan.detaches), *(a.device for a in plan.adopts)}
        verified = [verified_write(k, objects[k], verified=True, now=snapshot.now)
                    for k in sorted(self._unverified) if k not in done and k in objects]
        sent = await context.send([*attachments.attachment_writes(plan, objects), *verified], writes,
                          stop=stop)
        self._watch.judged(snapshot, judged, plan, (), clean=sent.clean)
        for write, _answer in sent.written:
            if isinstance(write.tag, attachments.Detach):
                detach = write.tag
                log.info("detached", device=write.what, vmi=detach.vmi, reason=detach.reason, deleted=detach.delete,
                         message=detach.message)
                if context.metrics is not None:
                    context.metrics.detaches.labels(reason=detach.reason, deleted=str(detach.delete).lower()).inc()
            elif isinstance(write.tag, attachments.Adopt):
                log.info("VMI UID recorded on the attachment", device=write.what, vmi=write.tag.vmi, uid=write.tag.uid)
        return _settle(sent)


class LedgerWork:
    """Keeps each hold's ledger and applies its class's idle-hold rule (``binder.ledger``).

    A pass judges the holds the model's change log says moved since the last clean pass (a device, or its
    VMI or launcher), those whose warning or release fell due (a heap of deadlines, with a reminder for
    the soonest), and those whose write the last pass did not get taken; every hold after a rebuild, a new
    term, and every ``whole_plan_every``, ``WHOLE_SLICE`` of them a pass (``Progress.MORE`` until done:
    10,000 holds judged at once held the event loop ~80 ms, ``bench/bench_ledger.py``).
    """

    #: Holds of a whole judgement judged per pass.
    WHOLE_SLICE = 1000

    def __init__(self, context: Context) -> None:
        self._context = context
        self._last: Snapshot | None = None
        self._whole_at: datetime | None = None
        #: The holds of a whole judgement not judged yet.
        self._backlog: list[DeviceKey] = []
        self._deadlines: list[tuple[datetime, DeviceKey]] = []
        #: Holds whose write the last pass did not get taken (refused, left when a placement pass was due, or
        #: dropped): judged again next pass, whatever the change log says — their due deadline was spent.
        self._again: set[DeviceKey] = set()
        self._reminder: Cancellable | None = None
        self._on_due: Callable[[], None] | None = None

    def on_due(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (the driver's ledger lane) when a hold's warning or release falls due."""
        self._on_due = callback

    def stopped(self) -> None:
        self._last, self._whole_at, self._deadlines, self._backlog = None, None, [], []
        self._again = set()
        if self._reminder is not None:
            self._reminder.cancel()
            self._reminder = None

    def _judged(self, snapshot: Snapshot) -> set[DeviceKey]:
        now = snapshot.now
        changes = snapshot.changes_since(self._last) if self._last is not None else None
        judged: set[DeviceKey] = set()
        if changes is None or self._whole_at is None or now - self._whole_at >= self._context.config.whole_plan_every:
            self._whole_at, self._deadlines = now, []
            self._backlog = sorted(key for key, device in snapshot.devices.items() if device.holds_units)
        else:
            judged.update(changes.devices)
            for vmi in changes.vmis:
                judged.update(snapshot.devices_by_vmi.get(vmi, ()))
        while self._deadlines and self._deadlines[0][0] <= now:
            judged.add(heapq.heappop(self._deadlines)[1])
        judged |= self._again
        self._again = set()
        judged.update(self._backlog[-self.WHOLE_SLICE:])
        del self._backlog[-self.WHOLE_SLICE:]
        return judged

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        if not context.config.gpu_enabled:
            return Progress.DONE
        snapshot, objects, _served = await context.snapshot()
        judged = self._judged(snapshot)
        planned = ledger.ledger_writes(snapshot, objects, judged, now=snapshot.now)
        sends = [Write(kind=specs.GPU_DEVICES, path=device_status_path(w.key), body={"status": w.status},
                       resource_version=w.resource_version, what="/".join(w.key), tag=w) for w in planned]
        sent = await context.send(sends, writes, stop=stop)
        for write in (*sent.refused, *sent.left, *sent.dropped):
            assert isinstance(write.tag, DeviceWrite)
            self._again.add(write.tag.key)
        for write, answer in sent.written:
            device_write = write.tag
            assert isinstance(device_write, DeviceWrite)
            context.events.record(device_write, meta.resource_version(answer), now=snapshot.now)
            released = any(note.reason == ledger.REASON_EXPIRED for note in device_write.events)
            log.info("hold released: idle past its class's limit" if released else "hold ledger written",
                     device=write.what, **{k: v for k, v in device_write.status.items() if k != "conditions"})
        for key in judged:
            device = snapshot.devices.get(key)
            at = ledger_model.next_deadline(device, snapshot.classes.get(device.class_name), snapshot.now) \
                if device is not None and device.holds_units else None
            if at is not None:
                heapq.heappush(self._deadlines, (at, key))
        self._remind(snapshot.now)
        if sent.clean and not sent.left:
            self._last = snapshot
        progress = _settle(sent)
        return Progress.MORE if self._backlog else progress

    def _remind(self, now: datetime) -> None:
        if self._reminder is not None:
            self._reminder.cancel()
            self._reminder = None
        if self._deadlines and self._on_due is not None:
            wait = (self._deadlines[0][0] - now).total_seconds()
            self._reminder = self._context.clock.call_later(max(wait, 0.0), self._due_now)

    def _due_now(self) -> None:
        self._reminder = None
        if self._on_due is not None:
            self._on_due()


class FinalizersWork:
    #: What the finalizers read: unchanged since a clean run, there is nothing to do.
    KINDS = (specs.GPU_CLASSES, specs.GPU_DEVICES, specs.VMIS)

    def __init__(self, context: Context) -> None:
        self._context = context
        self._work = finalizers.FinalizerWork()
        self._inputs = _StoreVersions(context, self.KINDS)

    def stopped(self) -> None:
        self._work, self._inputs.clean = finalizers.FinalizerWork(), None

    def device_changed(self, event: Event) -> None:
        self._work.device(event.old, None if event.type == "DELETED" else event.obj)

    def vmi_changed(self, _event: Event) -> None:
        self._work.vmi()

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        inputs = self._inputs.now()
        if inputs == self._inputs.clean:
            return Progress.DONE
        if self._inputs.replaced(inputs):
            self._work.everything()
        self._inputs.clean = None
        classes = context.cache.store(specs.GPU_CLASSES).list()
        vmis: Mapping[tuple[str, str], str] | None = None
        try:
            store = context.cache.store(specs.VMIS)
        except KindNotServed:
            pass  # every attachment counts as in use while the kind is not served (R-BIND-7)
        else:
            vmis = finalizers.VmiUids(store.get, store.list)
        # The binder's own placement writes read back (assumed): a finalizer patched on the version the
        # cache still shows would be refused by the status placement just wrote.
        changes = self._work.changes(classes, context.cache.store(specs.GPU_DEVICES).list, context.assumed.get,
                                     vmis, assumed=context.assumed.pending())
        sent = await context.send(finalizers.finalizer_writes(changes), writes, stop=stop)
        self._work.done(stale=not sent.clean)
        for write, _answer in sent.written:
            change = write.tag
            assert isinstance(change, finalizers.FinalizerChange)
            log.info("finalizer added" if change.add else "finalizer released", object=write.what,
                     finalizer=change.finalizer)
        if sent.clean:
            self._inputs.clean = inputs
        return _settle(sent)


class UsageWork:
    KINDS = (specs.GPU_CLASSES, specs.GPU_DEVICES, usage.WORKLOAD_MONITORS, usage.WORKLOADS)

    def __init__(self, context: Context) -> None:
        self._context = context
        self._inputs = _StoreVersions(context, self.KINDS)

    def stopped(self) -> None:
        self._inputs.clean = None

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        inputs = self._inputs.now()
        if inputs == self._inputs.clean:
            return Progress.DONE
        monitors, workloads = optional(context.cache, usage.WORKLOAD_MONITORS), optional(context.cache, usage.WORKLOADS)
        if monitors is None or workloads is None:
            return Progress.DONE  # Cozystack's usage kinds are not served here: nothing to record into
        plan = usage.usage_plan(context.assumed.objects(), context.cache.store(specs.GPU_CLASSES).list(), monitors,
                                workloads)
        sent = await context.send(usage.usage_writes(plan), writes, stop=stop)
        for write, _answer in sent.written:
            log.info("usage record removed" if write.body is None else "usage record written", object=write.what)
        self._inputs.clean = inputs if sent.clean else None
        return _settle(sent)


class ReportsWork:
    def __init__(self, context: Context) -> None:
        self._context = context
        #: When each object's report was last sent (its status path -> clock).
        self._reported: dict[str, float] = {}
        self._memo = reports.ReportMemo()
        self._reminder: Cancellable | None = None
        self._on_due: Callable[[], None] | None = None
        self._whole_at: datetime | None = None

    def on_due(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (the driver's report lane) when reports held back by ``report_every`` are due."""
        self._on_due = callback

    def stopped(self) -> None:
        self._reported, self._memo, self._whole_at = {}, reports.ReportMemo(), None
        if self._reminder is not None:
            self._reminder.cancel()
            self._reminder = None

    def gpunode_changed(self, event: Event) -> None:
        self._memo.changed(object_key(event.obj)[1])

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        if not context.config.gpu_enabled:
            return Progress.DONE
        snapshot, _objects, _served = await context.snapshot()
        if self._whole_at is None or snapshot.now - self._whole_at >= context.config.whole_plan_every:
            self._whole_at = snapshot.now
            self._memo.forget()  # now and then every GPUNode judged again, whatever the change log says
        gpunodes = context.cache.store(specs.GPU_NODES)
        due = self._due(reports.report_writes(
            snapshot, context.cache.store(specs.GPU_CLASSES).list(), gpunodes.list(), now=snapshot.now,
            memo=self._memo, lookup=lambda name: gpunodes.get(None, name), limit=context.config.reports_per_pass,
            judge_limit=context.config.reports_judged_per_pass))
        # A report refused on its resourceVersion is not a reason to requeue: the agent reports often, and
        # the change that beat it is itself an event of a watched kind, which asks for a pass.
        sent = await context.send(reports.report_sends(due), writes, stop=stop)
        for write in sent.left:  # not sent: due again at once
            self._reported.pop(write.path, None)
        if context.metrics is not None:
            context.metrics.observe_units(snapshot)
        return Progress.MORE if sent.left else Progress.DONE

    def _due(self, candidates: Sequence[reports.StatusWrite]) -> list[reports.StatusWrite]:
        """The report writes due now (at most ``reports_per_pass``); the others wait for the reminder."""
        config = self._context.config
        every, now = config.report_every.total_seconds(), self._context.clock.now()
        self._reported = {path: at for path, at in self._reported.items() if now - at < every}
        due: list[reports.StatusWrite] = []
        # GPUNodes the judgement left for later (its limit reached): the next pass judges more of them.
        wait = 0.0 if self._memo.left else math.inf
        for write in candidates:
            last = self._reported.get(write.path)
            if last is not None:
                wait = min(wait, last + every - now)
            elif len(due) < config.reports_per_pass:
                due.append(write)
                self._reported[write.path] = now
            else:
                wait = 0.0  # the next pass writes more, after the placement passes waiting
        if wait < math.inf and self._reminder is None:
            self._reminder = self._context.clock.call_later(max(wait, 0.0), self._due_now)
        return due

    def _due_now(self) -> None:
        self._reminder = None
        if self._on_due is not None:
            self._on_due()


class ClaimsWork:
    """Creates, allocates, moves and releases hold claims (``binder.claims``); nothing while the cluster
    serves no ResourceClaims."""

    KINDS = (specs.GPU_CLASSES, specs.GPU_DEVICES, specs.VMIS, specs.RESOURCE_CLAIMS, specs.RESOURCE_SLICES,
             specs.DEVICE_CLASSES, specs.DEVICE_TAINT_RULES)

    def __init__(self, context: Context) -> None:
        self._context = context
        self._inputs = _StoreVersions(context, self.KINDS)

    def stopped(self) -> None:
        self._inputs.clean = None

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        if not context.config.gpu_enabled:
            return Progress.DONE
        try:
            store = context.cache.store(specs.RESOURCE_CLAIMS)
        except KindNotServed:
            return Progress.DONE
        inputs = self._inputs.now()
        if inputs == self._inputs.clean:
            return Progress.DONE
        snapshot, _objects, _served = await context.snapshot()
        plan = claims.claims_plan(snapshot, context.live.dra)
        seen = {key: obj for key in {step.device for step in plan.steps} | set(plan.release)
                if (obj := store.get(*key)) is not None}
        first = await context.send(claims.first_writes(plan, snapshot, seen), writes, stop=stop)
        then = claims.allocations_after(first.written, snapshot)
        second = await context.send(then, writes) if then else Sent()
        for write, _answer in (*first.written, *second.written):
            log.info("hold claim written", object=write.what)
        for step in plan.steps:
            if step.refusal is not None:
                log.warning("hold claim short of devices", device=f"{step.device[0]}/{step.device[1]}",
                            why=step.refusal.message)
        sent = Sent(first.written + second.written, first.refused + second.refused, first.left + second.left)
        self._inputs.clean = inputs if sent.clean else None
        return _settle(sent)


class VerifyWork:
    """The safety net (R-BIND-1): every ``verify_every`` the model is built again from the stores and
    compared with the live one; a difference is counted (``cozygpu_read_model_drift_total``), logged with
    the first differing field and key, and repaired (the next snapshot is built from the stores)."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._verified_at: float | None = None
        self._reminder: Cancellable | None = None
        self._on_due: Callable[[], None] | None = None

    def on_due(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (the driver's verify lane) when the next check is due."""
        self._on_due = callback

    def stopped(self) -> None:
        self._verified_at = None
        if self._reminder is not None:
            self._reminder.cancel()
            self._reminder = None

    def _remind(self, after: float) -> None:
        if self._reminder is None and self._on_due is not None:
            self._reminder = self._context.clock.call_later(max(after, 0.0), self._due_now)

    def _due_now(self) -> None:
        self._reminder = None
        if self._on_due is not None:
            self._on_due()

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        now = context.clock.now()
        if not context.config.gpu_enabled:
            return Progress.DONE
        every = context.config.verify_every.total_seconds()
        if self._verified_at is None:
            self._verified_at = now  # the term's model is built from the stores by its first pass
        elif now - self._verified_at >= every:
            self._verified_at = now
            await self.verify()
        self._remind(self._verified_at + every - now)
        return Progress.DONE

    async def verify(self) -> str | None:
        context = self._context
        drift = await context.model.verify()
        if drift is not None:
            log.warning("the live read model drifted from the stores; rebuilt", first_difference=drift)
            if context.metrics is not None:
                context.metrics.drift.inc()
        return drift
