"""The binder's housekeeping works, each a lane of its own on the driver after placement.

- ``ClaimsWork``: the hold claims of DRA-sourced devices (SPEC §1.5), right
  after placement: a VM start waits for its claim's allocation;
- ``AttachmentsWork``: attachments whose VMI is gone or never came, UIDs to
  adopt (R-BIND-8), and ``AttachmentVerified`` back to True once VMIs are
  served (R-BIND-7);
- ``LedgerWork``: each hold's ledger and its class's idle-hold rule
  (R-LEDGER-1, R-LEDGER-2);
- ``FinalizersWork``: device and class finalizers (R-BIND-9);
- ``UsageWork``: Cozystack usage records (R-BIND-9);
- ``ReportsWork``: GPUClass status and GPUNode conditions (R-BIND-10), one
  report at most every ``report_every``;
- ``VerifyWork``: the safety net, the read model checked against a build
  from the stores every ``verify_every``.

All but the check are keyed reconcilers (``reconciler``): their events
queue keys, a pass judges the keys ready one by one and settles each by what
the API server did with its own writes (a refused one is retried after its
own backoff). Each writes through the patcher and stops between writes when
the driver says a lane before it is due (``stop``): it then answers
``Progress.MORE``, so a bind request waits behind one write of
housekeeping, never behind all of it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta

from cozygpu import keys
from cozygpu.api import classes as class_json
from cozygpu.api import meta
from cozygpu.base.clock import Cancellable
from cozygpu.base.logging import get_logger
from cozygpu.binder import attachments, claims, finalizers, ledger, reports, usage
from cozygpu.binder.assumed import object_key
from cozygpu.binder.context import Context
from cozygpu.binder.patcher import Sent, Write
from cozygpu.binder.place import unverified, verified_write
from cozygpu.binder.reconciler import NOTHING, ChangeFeed, Due, Send, devices_touched, reconcile
from cozygpu.binder.status import DeviceWrite
from cozygpu.binder.writes import device_status_path
from cozygpu.cache.errors import KindNotServed, NotSynced
from cozygpu.cache.store import Event
from cozygpu.kube.client import Obj
from cozygpu.model import ledger as ledger_model
from cozygpu.model.dra import DeviceRef
from cozygpu.model.dra_claims import ClaimStep
from cozygpu.model.snapshot import Changes, DeviceKey, GPUClassView, Snapshot
from cozygpu.passes.driver import Progress
from cozygpu.passes.keyed import KeyQueue
from cozygpu.passes.writes import Writes
from cozygpu.views import specs
from cozygpu.views.decode_dra import resource_claim_view

log = get_logger("cozygpu.binder")

#: Stops a pass between two writes when true (the driver: a lane before this one is due).
Stop = Callable[[], bool]


def _idle_rule(gpu_class: GPUClassView | None) -> tuple[timedelta | None, timedelta] | None:
    """What a hold's ledger reads of its class (R-LEDGER-2): its idle-hold limit and warning."""
    return (gpu_class.idle_hold_limit, gpu_class.idle_hold_warning) if gpu_class is not None else None


def _never() -> bool:
    return False


class AttachmentsWork:
    """Attachments whose VMI is gone or never came, UIDs to record, and ``AttachmentVerified`` back to True
    once VMIs are served (``binder.attachments``), device by device.

    Its keys are devices: those the model's change log names (a device, or its VMI or launcher), the devices
    whose ``AttachmentVerified`` is False (from the device events), every attached device when the log cannot
    say what moved (a first build, a DRA input rebuilt) and at a term's start. An attachment waiting for its
    VMI is looked at again when its grace ends.
    """

    def __init__(self, context: Context) -> None:
        self._context = context
        self.queue: KeyQueue[DeviceKey] = KeyQueue(context.clock)
        self._feed = ChangeFeed()
        #: When the binder first saw an attachment that carries no time (R-BIND-8's grace starts then).
        self._first_seen: dict[DeviceKey, datetime] = {}
        #: Devices whose ``AttachmentVerified`` is False, kept from the device events (no scan of every device).
        self._unverified: set[DeviceKey] = set()

    def started(self, devices: Iterable[Obj]) -> None:
        self._unverified = {object_key(obj) for obj in devices if unverified(obj)}
        self.queue.add_all(sorted(self._unverified))

    def stopped(self) -> None:
        self.queue.clear()
        self._feed.forget()
        self._first_seen, self._unverified = {}, set()

    @staticmethod
    def to_judge(snapshot: Snapshot, changes: Changes | None) -> list[DeviceKey]:
        """The devices whose verdict may have moved since the change log's ``changes`` (None: every attached
        device)."""
        if changes is None:
            return sorted(d.key for d in attachments.attached_devices(snapshot))
        return sorted(devices_touched(snapshot, changes))

    def device_changed(self, event: Event) -> None:
        key = object_key(event.obj)
        if event.type != "DELETED" and unverified(event.obj):
            self._unverified.add(key)
            self.queue.add(key)
        else:
            self._unverified.discard(key)

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        if not context.config.gpu_enabled:
            return Progress.DONE
        snapshot, objects, served = await context.snapshot()
        if not served:
            return Progress.DONE  # nothing can be judged: the placement work says so on the devices (R-BIND-7)
        self.queue.add_all(self.to_judge(snapshot, self._feed.since(snapshot)))
        grace = context.config.attachment_grace
        claimed = functools.cache(functools.partial(attachments.claimed_vmis, snapshot))

        def judge(key: DeviceKey) -> Due:
            device, obj = snapshot.devices.get(key), objects.get(key)
            if device is None or obj is None:
                self._first_seen.pop(key, None)
                return NOTHING
            if device.attachment is None:
                self._first_seen.pop(key, None)
            elif device.attachment.attached_at is None:
                self._first_seen.setdefault(key, snapshot.now)
            action = attachments.judge(snapshot, device, grace=grace, first_seen=self._first_seen.get(key),
                                       claimed=claimed)
            found = attachments.attachment_writes(action.plan, objects)
            if not found and key in self._unverified:
                found = [verified_write(key, obj, verified=True, now=snapshot.now)]
            return Due(writes=tuple(found), again_in=action.again_in)

        done = await reconcile(context.send, self.queue, judge, writes, stop)
        for write, _answer in done.sent.written:
            if isinstance(write.tag, attachments.Detach):
                detach = write.tag
                log.info("detached", device=write.what, vmi=detach.vmi, reason=detach.reason, deleted=detach.delete,
                         message=detach.message)
                if context.metrics is not None:
                    context.metrics.detaches.labels(reason=detach.reason, deleted=str(detach.delete).lower()).inc()
            elif isinstance(write.tag, attachments.Adopt):
                log.info("VMI UID recorded on the attachment", device=write.what, vmi=write.tag.vmi, uid=write.tag.uid)
        return done.progress


class LedgerWork:
    """Keeps each hold's ledger and applies its class's idle-hold rule (``binder.ledger``), hold by hold.

    Its keys are holds: those the model's change log names (a device, or its VMI or launcher), every hold of
    a class whose idle-hold rule changed, every hold when the log cannot say what moved and
    at a term's start; each judged hold is looked
    at again at its next deadline (its warning, then its release).
    """

    def __init__(self, context: Context) -> None:
        self._context = context
        self.queue: KeyQueue[DeviceKey] = KeyQueue(context.clock)
        self._feed = ChangeFeed()
        self._classes: Mapping[str, GPUClassView] | None = None

    def stopped(self) -> None:
        self.queue.clear()
        self._feed.forget()
        self._classes = None

    def _follow(self, snapshot: Snapshot) -> None:
        changes = self._feed.since(snapshot)
        classes, self._classes = self._classes, snapshot.classes
        if changes is None:
            self.queue.add_all(sorted(key for key, device in snapshot.devices.items() if device.holds_units))
            return
        self.queue.add_all(sorted(devices_touched(snapshot, changes)))
        if classes is not None and classes is not snapshot.classes:
            moved = {name for name, view in snapshot.classes.items()
                     if _idle_rule(classes.get(name)) != _idle_rule(view)}
            if moved:  # an idle-hold rule changed: its holds are judged again (a class's rule changes rarely)
                self.queue.add_all(sorted(key for key, device in snapshot.devices.items()
                                          if device.class_name in moved and device.holds_units))

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        if not context.config.gpu_enabled:
            return Progress.DONE
        snapshot, objects, _served = await context.snapshot()
        self._follow(snapshot)
        now = snapshot.now

        def judge(key: DeviceKey) -> Due:
            device, obj = snapshot.devices.get(key), objects.get(key)
            if device is None or obj is None or not device.holds_units:
                return NOTHING
            write = ledger.hold_write(device, obj, running=ledger_model.runs(snapshot, device), snapshot=snapshot,
                                      now=now)
            at = ledger_model.next_deadline(device, snapshot.classes.get(device.class_name), now)
            again = (at - now).total_seconds() if at is not None else None
            if write is None:
                return Due(again_in=again)
            send = Write(kind=specs.GPU_DEVICES, path=device_status_path(key), body={"status": write.status},
                         resource_version=write.resource_version, what="/".join(key), tag=write)
            return Due(writes=(send,), again_in=again)

        done = await reconcile(context.send, self.queue, judge, writes, stop)
        for write, answer in done.sent.written:
            device_write = write.tag
            assert isinstance(device_write, DeviceWrite)
            context.events.record(device_write, meta.resource_version(answer), now=now)
            released = any(note.reason == ledger.REASON_EXPIRED for note in device_write.events)
            log.info("hold released: idle past its class's limit" if released else "hold ledger written",
                     device=write.what, **{k: v for k, v in device_write.status.items() if k != "conditions"})
        return done.progress


class FinalizersWork:
    """Class and device finalizers (``binder.finalizers``), object by object; with GPU enabled or not.

    Its keys come from the GPUDevice, GPUClass and VMI events (``finalizers.keys_of_device_event``; a VMI's
    deleting devices), and every device and class at a term's start.
    """

    def __init__(self, context: Context) -> None:
        self._context = context
        self.queue: KeyQueue[finalizers.Key] = KeyQueue(context.clock)

    def started(self, devices: Iterable[Obj], classes: Iterable[Obj]) -> None:
        self.queue.add_all(sorted(finalizers.device_key(*object_key(obj)) for obj in devices))
        self.queue.add_all(sorted(finalizers.class_key(meta.name(obj)) for obj in classes))

    def stopped(self) -> None:
        self.queue.clear()

    def device_changed(self, event: Event) -> None:
        self.queue.add_all(finalizers.keys_of_device_event(event.old, None if event.type == "DELETED" else event.obj))

    def class_changed(self, event: Event) -> None:
        self.queue.add(finalizers.class_key(meta.name(event.obj)))

    def vmi_changed(self, event: Event) -> None:
        """The deleting devices attached to the VMI: only those can a VMI keep."""
        namespace, name = object_key(event.obj)
        try:
            store = self._context.cache.store(specs.GPU_DEVICES)
        except (KindNotServed, NotSynced):
            return  # the term's first pass looks at every device
        attached = store.by_index(specs.DEVICES_BY_VMI, f"{namespace}/{name}")
        self.queue.add_all(finalizers.device_key(*object_key(d)) for d in attached if meta.deleting(d))

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        if not self.queue.ready():
            return Progress.DONE
        classes, devices = context.cache.store(specs.GPU_CLASSES), context.cache.store(specs.GPU_DEVICES)
        vmis: Mapping[tuple[str, str], str] | None = None
        try:
            store = context.cache.store(specs.VMIS)
        except KindNotServed:
            pass  # every attachment counts as in use while the kind is not served (R-BIND-7)
        else:
            vmis = finalizers.VmiUids(store.get, store.list)
        now, grace, assumed = context.clock.wall(), context.config.attachment_grace, context.assumed

        def judge(key: finalizers.Key) -> Due:
            plural, namespace, name = key
            if plural == keys.GPUDEVICE_PLURAL:
                # The binder's own placement writes read back (assumed): a finalizer patched on the version the
                # cache still shows would be refused by the status placement just wrote.
                device = assumed.get(namespace, name)
                judged = finalizers.judge_device(device, vmis, now=now, grace=grace) if device is not None else None
            else:
                gpu_class = classes.get(None, name)
                held = gpu_class is not None and meta.deleting(gpu_class) and (
                    finalizers.holding(devices.by_index(specs.DEVICES_BY_CLASS, name), name)
                    or finalizers.holding(assumed.pending(), name))
                judged = finalizers.judge_class(gpu_class, held) if gpu_class is not None else None
            if judged is None:
                return NOTHING
            found = finalizers.finalizer_writes([judged.change] if judged.change is not None else [])
            return Due(writes=tuple(found), again_in=judged.again_in)

        done = await reconcile(context.send, self.queue, judge, writes, stop)
        for write, _answer in done.sent.written:
            change = write.tag
            assert isinstance(change, finalizers.FinalizerChange)
            log.info("finalizer added" if change.add else "finalizer released", object=write.what,
                     finalizer=change.finalizer)
        return done.progress


class UsageWork:
    """Cozystack usage records (``binder.usage``), namespace by namespace; with GPU enabled or not.

    Its keys are namespaces: a device's, the namespaces of a class's devices when its resource name moves (its
    resource name is in their records), a Workload's or WorkloadMonitor's, and at a term's start every
    namespace with a device or a record of ours.
    """

    def __init__(self, context: Context) -> None:
        self._context = context
        self.queue: KeyQueue[str] = KeyQueue(context.clock)

    def started(self, devices: Iterable[Obj], records: Iterable[Obj]) -> None:
        self.queue.add_all(sorted({meta.namespace(obj) for obj in (*devices, *records)}))

    def stopped(self) -> None:
        self.queue.clear()

    def changed(self, event: Event) -> None:
        """A GPUDevice, Workload or WorkloadMonitor event: its namespace."""
        self.queue.add(meta.namespace(event.obj))

    def class_changed(self, event: Event) -> None:
        """A GPUClass event: its devices' namespaces, when its resource name (all a record reads of it) came,
        went or moved; the binder's own class report, every order's echo, asks for nothing."""
        if (event.old is not None and event.type != "DELETED"
                and class_json.resource_name(event.old) == class_json.resource_name(event.obj)):
            return
        try:
            store = self._context.cache.store(specs.GPU_DEVICES)
        except (KindNotServed, NotSynced):
            return  # the term's first pass looks at every namespace
        held = store.by_index(specs.DEVICES_BY_CLASS, meta.name(event.obj))
        self.queue.add_all(sorted({meta.namespace(device) for device in held}))

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        try:
            monitors, workloads = context.cache.store(usage.WORKLOAD_MONITORS), context.cache.store(usage.WORKLOADS)
        except KindNotServed:
            return Progress.DONE  # Cozystack's usage kinds are not served here: the keys wait for them
        if not self.queue.ready():
            return Progress.DONE
        devices, classes, assumed = context.cache.store(specs.GPU_DEVICES), context.cache.store(specs.GPU_CLASSES), \
            context.assumed
        listed = classes.list()

        def judge(namespace: str) -> Due:
            held = [found for obj in devices.list(namespace) if (found := assumed.get(*meta.key(obj))) is not None]
            plan = usage.usage_plan(held, listed, monitors.list(namespace), workloads.list(namespace))
            return Due(writes=tuple(usage.usage_writes(plan)))

        done = await reconcile(context.send, self.queue, judge, writes, stop)
        for write, _answer in done.sent.written:
            log.info("usage record removed" if write.body is None else "usage record written", object=write.what)
        return done.progress


class ReportsWork:
    """GPUClass status and GPUNode conditions (``binder.reports``), report by report.

    Its keys are reports: those the model's change log may have moved (``reports.keys_changed``), a GPUNode
    or GPUClass whose object changed, every one when the log cannot say what moved and
    at a term's start. One report is written
    at most every ``report_every``: a change within it is judged again when it is over.
    """

    def __init__(self, context: Context) -> None:
        self._context = context
        self.queue: KeyQueue[reports.Key] = KeyQueue(context.clock)
        self._feed = ChangeFeed()
        #: When each report was last written (the clock's), while that is under ``report_every`` ago.
        self._written: dict[reports.Key, float] = {}

    def stopped(self) -> None:
        self.queue.clear()
        self._feed.forget()
        self._written = {}

    def changed(self, event: Event) -> None:
        """A GPUNode or GPUClass event: its report."""
        self.queue.add((meta.kind(event.obj), meta.name(event.obj)))

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        if not context.config.gpu_enabled:
            return Progress.DONE
        snapshot, _objects, _served = await context.snapshot()
        self.queue.add_all(reports.keys_changed(snapshot, self._feed.since(snapshot)))
        stores = {keys.GPUCLASS_KIND: context.cache.store(specs.GPU_CLASSES),
                  keys.GPUNODE_KIND: context.cache.store(specs.GPU_NODES)}
        every, clock_now = context.config.report_every.total_seconds(), context.clock.now()
        self._written = {key: at for key, at in self._written.items() if clock_now - at < every}

        def judge(key: reports.Key) -> Due:
            kind, name = key
            obj = stores[kind].get(None, name)
            if obj is None:
                return NOTHING
            report = (reports.class_write if kind == keys.GPUCLASS_KIND else reports.node_write)(snapshot, obj,
                                                                                                 snapshot.now)
            if report is None:
                return NOTHING
            last = self._written.get(key)
            if last is not None:
                return Due(again_in=last + every - clock_now)  # written a moment ago: this waits its turn
            return Due(writes=tuple(reports.report_sends([report])))

        done = await reconcile(context.send, self.queue, judge, writes, stop)
        for write, _answer in done.sent.written:
            report = write.tag
            assert isinstance(report, reports.StatusWrite)
            self._written[(report.kind, report.name)] = clock_now
        if context.metrics is not None:
            context.metrics.observe_units(snapshot)
        return done.progress


class ClaimsWork:
    """Creates, allocates, moves and releases hold claims (``binder.claims``), device by device; nothing
    while the cluster serves no ResourceClaims.

    Its keys are devices (a hold claim is named after its GPUDevice): those the model's change log names (a
    device, the devices of a VMI it names, the devices on a node whose DRA units a claim took or freed:
    ``claims.keys_changed``), the device of a hold claim that changed, came or went (its events), and every
    DRA hold and hold claim when the log cannot say what moved (a slice, DeviceClass, DeviceTaintRule, claim
    store or DRA class rebuilt)
    and at a term's start. Devices judged in one pass never share a unit (``claims.device_plan``'s
    ``chosen``); a pass after the writes waits for the cache to show them, so the next one's tracker holds
    them.
    """

    def __init__(self, context: Context) -> None:
        self._context = context
        self.queue: KeyQueue[DeviceKey] = KeyQueue(context.clock)
        self._feed = ChangeFeed()

    def stopped(self) -> None:
        self.queue.clear()
        self._feed.forget()

    def claim_changed(self, event: Event) -> None:
        """A ResourceClaim event: a hold claim's device (deleted out of band, it is made again; someone
        else's claim moves units, which the change log names by their node)."""
        for obj in (event.obj, event.old):
            if obj is not None and resource_claim_view(obj).is_hold:
                self.queue.add(object_key(obj))
                return

    async def run(self, writes: Writes, stop: Stop = _never) -> Progress:
        context = self._context
        if not context.config.gpu_enabled:
            return Progress.DONE
        try:
            store = context.cache.store(specs.RESOURCE_CLAIMS)
        except KindNotServed:
            return Progress.DONE
        snapshot, _objects, _served = await context.snapshot()
        dra = context.live.dra
        self.queue.add_all(claims.keys_changed(snapshot, self._feed.since(snapshot), dra))
        chosen: dict[DeviceRef, DeviceKey] = {}

        def judge(key: DeviceKey) -> Due:
            plan = claims.device_plan(snapshot, dra, key, chosen)
            for step in plan.steps:
                if step.refusal is not None:
                    log.warning("hold claim short of devices", device=f"{key[0]}/{key[1]}", why=step.refusal.message)
            if not plan.steps and not plan.release:
                return NOTHING
            obj = store.get(*key)
            return Due(writes=tuple(claims.first_writes(plan, snapshot, {key: obj} if obj is not None else {})))

        done = await reconcile(_then_allocate(context.send, snapshot), self.queue, judge, writes, stop)
        for write, _answer in done.sent.written:
            log.info("hold claim written", object=write.what)
        return done.progress


def _then_allocate(send: Send, snapshot: Snapshot) -> Send:
    """``send``, and then the allocation that follows each create or deallocation the server took, on the
    version it answered (``claims.allocations_after``), so one pass carries a claim from nothing to
    allocated. An allocation refused is its key's refusal: the first write it followed is reported refused
    (``reconcile`` knows a key by the writes its judge gave), and the key is judged again after its backoff
    (its claim made or deallocated by then: an allocation alone)."""

    async def both(writes: Iterable[Write], record: Writes, *, stop: Callable[[], bool] | None = None) -> Sent:
        first = await send(writes, record, stop=stop)
        then = claims.allocations_after(first.written, snapshot)
        if not then:
            return first
        second = await send(then, record)  # not stopped: a claim made is allocated in the same pass
        before = {write.tag.device: write for write, _answer in first.written if isinstance(write.tag, ClaimStep)}
        failed = tuple(before[write.tag.step.device] for write in (*second.refused, *second.dropped, *second.left)
                       if isinstance(write.tag, claims.Allocation))
        return Sent(first.written + second.written, first.refused + failed, first.left, first.dropped)

    return both


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
