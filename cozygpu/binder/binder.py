"""The binder's passes: snapshot → plan → writes, in the leader term only (R-BIND-1…10).

Two passes, both run by the pass driver (``cozygpu.passes``), never at once,
and both decide placement the same way — one **placement cycle**: R-BIND-5 in
order (restore sets, move, rebind Lost, answer, bind new orders) over only
the sets whose inputs changed since the last cycle (``cycle_view``, from the
read model's change log), which decides what a pass over every set would
(R-BIND-1):

- the **answer pass** is a placement cycle alone. A bind request or a new
  order asks for it the moment it is seen, so it is decided in the very next
  cycle (R-BIND-3); a webhook waiting for its answer waits for this pass only.
- the **full pass** is a placement cycle, then what follows the world:
  attachments whose VMI is gone or never came (R-BIND-8), GPUClass status and
  GPUNode conditions (R-BIND-10), and the always-on reconcilers (finalizers,
  usage records: R-BIND-9).

No decision from a stale view (R-BIND-2): every placement write the server
takes is assumed (``Assumed``) — read back by the read model and the next
cycle until the cache shows it — so the next placement cycle never waits
for the watch; every other write is recorded in the pass's ``Writes`` and
the driver waits until the cache has seen it before the next pass (a full
pass waits for the assumed ones too). Each write also carries the
resourceVersion the decision was made on, so a write decided on a view that
missed someone else's change (another replica that still thinks it leads,
say) is refused with a Conflict, and the pass requeues. With two replicas
this holds because the precondition, not the lease, guards every write: the
deposed leader's writes fail on the newer resourceVersion.

R-BIND-7: while a device is attached and the VMI kind is not served, the
binder cannot tell a running VM from an absent one, so both passes fail
before deciding anything (``AttachmentsUnverified``) and the devices carry
an ``AttachmentVerified=False`` condition saying so; the pass runs again when
the VMI kind is served (its informer's trigger) or after the failure backoff.

Without ``--enable-gpu`` only the reconcilers run (the full pass's last step):
finalizers and usage records never wait for GPU to be enabled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import attrs

from cozygpu import keys
from cozygpu.base.clock import Cancellable, Clock
from cozygpu.base.logging import get_logger
from cozygpu.binder import attachments, finalizers, reports, usage
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.binder.recorder import DEFAULT_CAPACITY, EventRecorder
from cozygpu.binder.status import plan_writes
from cozygpu.binder.writes import WriteReport, device_status_path, write_sets
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import KindNotServed, NotSynced
from cozygpu.cache.informer import resource_version_at_least
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.store import Event, Store
from cozygpu.kube import Client, errors
from cozygpu.kube.client import Obj
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE, DEFAULT_REPORT_STALE_AFTER
from cozygpu.model.placement import Bind, KeepPending, PassPlan, Stay, plan_pass
from cozygpu.model.snapshot import DeviceKey, Snapshot, VmiKey
from cozygpu.passes.writes import Writes
from cozygpu.views import specs
from cozygpu.views.live import LiveSnapshot, Source

log = get_logger("cozygpu.binder")

ATTACHMENT_VERIFIED: Final = "AttachmentVerified"

#: Cozystack's usage kinds (``../shared/reference/cozystack.md`` §3); cached once served.
WORKLOAD_MONITORS: Final = KindSpec("cozystack.io", "v1alpha1", "workloadmonitors", "WorkloadMonitor", True)
WORKLOADS: Final = KindSpec("cozystack.io", "v1alpha1", "workloads", "Workload", True)


@attrs.frozen(kw_only=True)
class BinderConfig:
    identity: str
    gpu_enabled: bool = True
    attachment_grace: timedelta = timedelta(minutes=2)
    #: How long a pod that claims to be a VMI's launcher may go unproven before it can move a hold (R-MOD-7).
    launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE
    hoster_names: tuple[str, ...] = ()
    report_stale_after: timedelta = DEFAULT_REPORT_STALE_AFTER
    #: A full pass plans over every set at least this often (otherwise over what could have changed).
    whole_plan_every: timedelta = timedelta(minutes=5)
    #: A full pass checks the live read model against a build from the stores at least this often.
    verify_every: timedelta = timedelta(minutes=5)
    #: One GPUClass or GPUNode report is written at most this often; a change within it is written when
    #: it is over, by a full pass asked for then. Reports are for people: under a stream of orders, a
    #: report per order doubled the binder's writes and queued the next order's placement behind them.
    report_every: timedelta = timedelta(seconds=1)
    #: At most this many reports are written by one full pass; the rest by the next, which a reminder asks
    #: for at once. Answer passes run in between: a fleet's first reports (thousands of GPUNodes) would
    #: otherwise hold every placement for as long as they take to write.
    reports_per_pass: int = 32
    #: Events queued at most for sending off the placement path; more are dropped and counted.
    event_queue: int = DEFAULT_CAPACITY


def _unanswered(obj: Mapping[str, Any] | None) -> str:
    """The id of the device's unanswered bind request, or ""."""
    status = (obj or {}).get("status") or {}
    request = status.get("bindRequest") or {}
    answer = status.get("bindAnswer") or {}
    request_id = request.get("id") if isinstance(request, Mapping) else None
    if not request_id:
        return ""
    answered = answer.get("id") if isinstance(answer, Mapping) else None
    return "" if answered == request_id else str(request_id)


def _class_changed(event: Event) -> bool:
    """Anything of a GPUClass but its status moved (or it came or went)."""
    old, new = event.old, event.obj
    if old is None or event.type == "DELETED":
        return True
    before, after = old.get("metadata") or {}, new.get("metadata") or {}
    return (old.get("spec") != new.get("spec") or before.get("finalizers") != after.get("finalizers")
            or before.get("deletionTimestamp") != after.get("deletionTimestamp"))


def _new_order(obj: Mapping[str, Any]) -> bool:
    """A GPUDevice not accepted yet (no phase, or Pending) that carries no answer."""
    status = obj.get("status") or {}
    return (status.get("phase") or "Pending") == "Pending" and not status.get("bindAnswer")


def _unverified(obj: Mapping[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or ()
    return any(isinstance(c, Mapping) and c.get("type") == ATTACHMENT_VERIFIED and c.get("status") == "False"
               for c in conditions)


def _key(obj: Mapping[str, Any]) -> DeviceKey:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))



def _with_whole_sets(snapshot: Snapshot, keep: set[DeviceKey]) -> Snapshot:
    """``snapshot`` with only the devices of ``keep``, each with its whole set (its VMI's members), and every
    set held on a node over its capacity, where the capacity-lost rule weighs them all; units, budgets and
    availability stay the whole snapshot's."""
    devices = snapshot.devices
    for node in snapshot.over_capacity:  # kept by the model as capacities change: no walk over the fleet
        keep.update(snapshot.devices_by_node.get(node, ()))
    by_vmi: dict[VmiKey, tuple[DeviceKey, ...]] = {}
    for key in list(keep):
        device = devices[key]
        if device.attachment is not None:
            vmi = (device.namespace, device.attachment.vmi)
            if vmi not in by_vmi:
                by_vmi[vmi] = snapshot.devices_by_vmi.get(vmi, (key,))
                keep.update(by_vmi[vmi])
    return attrs.evolve(snapshot, devices={k: devices[k] for k in keep}, devices_by_vmi=by_vmi)


@attrs.frozen
class Planned:
    """What a placement cycle planned on: its whole snapshot, the devices its plan acted on, and the reason
    each order still Pending or Lost was last kept so (that cycle's, or carried from an earlier one)."""

    snapshot: Snapshot
    acted: frozenset[DeviceKey]
    kept: Mapping[DeviceKey, KeepPending] = attrs.field(factory=dict)

    @classmethod
    def of(cls, snapshot: Snapshot, view: Snapshot, plan: PassPlan, last: Planned | None = None) -> Planned:
        """``acted``: every device the plan decided something for, except an order kept Pending for the
        very reason the last cycle gave (a repeat changes nothing, so it is no reason to judge it again).
        ``view``: what the plan was made on (a set in it that the plan keeps for no reason has none)."""
        before = last.kept if last is not None else {}
        if view is snapshot:
            kept: dict[DeviceKey, KeepPending] = {}
        else:
            kept = {k: v for k, v in before.items() if k in snapshot.unsettled and k not in view.devices}
        acted: set[DeviceKey] = set()
        for action in plan.actions:
            if isinstance(action, Stay):
                acted.update(action.devices)
                continue
            if isinstance(action, KeepPending):
                kept[action.device] = action
                if before.get(action.device) == action:
                    continue
            acted.add(action.device)
        return cls(snapshot, frozenset(acted), kept)


def cycle_view(snapshot: Snapshot, last: Planned | None, *, unsettled: bool = False) -> Snapshot:
    """``snapshot`` with only the sets a placement cycle could decide anything new for, given the last cycle.

    A set is left out only when the last cycle's plan did nothing new for it
    and nothing it is judged on changed since. A Bound set that kept its
    node (no Bind, MarkLost, Stay or answer among its members) is judged on
    its members' views, its VMI's view and its launchers' pods, and its
    node's view, report and capacity; left out, it keeps its node again —
    the keep rule reads only those — and plans nothing. A Pending or Lost
    set that was kept so for a reason is judged, besides its own views, on
    the room for its resource name and on the tenants' usage: while neither
    moved (``Changes.names``, ``Changes.usage``) it would be kept for the
    very same reason, so it is left out (``unsettled``: never). A set with
    a bind request not answered yet is always in. What other sets are
    decided against (free units, budgets, availability) stays the whole
    snapshot's, and every set on a node over its capacity is in, where the
    capacity-lost rule weighs them all. So the plan on the view is the plan
    on the whole snapshot, action for action, but for the repeated reasons
    of orders left out (``plan_cycle``; ``tests/binder/test_cycle_view.py``).
    What changed is the model's change log (``Snapshot.changes_since``): it
    costs what changed, not the fleet. A rebuild of the model since (a
    class, what KubeVirt permits or the resource names in effect changed, a
    store was replaced), or no last cycle, plans everything.
    """
    if last is None:
        return snapshot
    changes = snapshot.changes_since(last.snapshot)
    if changes is None:
        return snapshot
    devices = snapshot.devices
    keep: set[DeviceKey] = set(snapshot.asking)
    if unsettled or changes.usage:
        keep.update(snapshot.unsettled)
    else:
        by_name = snapshot.unsettled_by_name
        keep.update(by_name.get("", ()))
        for name in changes.names:
            keep.update(by_name.get(name, ()))
    keep.update(k for k in last.acted if k in devices)
    keep.update(k for k in changes.devices if k in devices)
    for node in changes.nodes:
        keep.update(snapshot.devices_by_node.get(node, ()))
    for vmi in changes.vmis:
        keep.update(snapshot.devices_by_vmi.get(vmi, ()))
    return _with_whole_sets(snapshot, keep)


def plan_cycle(snapshot: Snapshot, last: Planned | None) -> tuple[Snapshot, PassPlan]:
    """One placement cycle's view and plan (R-BIND-5 over the sets whose inputs changed).

    An order left out of the view would have been kept for last cycle's
    reason — unless this cycle books units ahead of it: then its reason may
    now name other numbers, so when the plan binds anything while some
    Pending or Lost order was left out, the cycle plans again with every
    one of them in.
    """
    view = cycle_view(snapshot, last)
    plan = plan_pass(view)
    if view is snapshot or not any(isinstance(a, Bind) for a in plan.actions):
        return view, plan
    if all(k in view.devices for k in snapshot.unsettled):
        return view, plan
    view = cycle_view(snapshot, last, unsettled=True)
    return view, plan_pass(view)


class Assumed:
    """The binder's own placement writes, read back until the cache shows them (R-BIND-2; kube-scheduler's
    assume, then bind without waiting for the watch).

    A written device's answer (the object the server stored) is *assumed*: the read model and the next
    cycle's preconditions read it instead of the store's older copy, so the next placement cycle need
    not wait for the watch to echo the write. The store's copy ends the assumption once it is as new
    (the write confirmed) or newer (someone wrote after it), or gone. Only a write the server took is
    assumed: a refused one (409, gone) never was, so there is nothing to forget.
    """

    def __init__(self, store: Callable[[], Store]) -> None:
        self._store = store
        self._written: dict[DeviceKey, Obj] = {}

    def __len__(self) -> int:
        return len(self._written)

    def add(self, key: DeviceKey, answer: Obj) -> None:
        self._written[key] = answer

    def clear(self) -> None:
        self._written.clear()

    def get(self, namespace: str, name: str) -> Obj | None:
        """The device as the binder last knows it: its own write until the store shows that or newer."""
        found = self._store().get(namespace, name)
        written = self._written.get((namespace, name))
        if written is None:
            return found
        if found is None or resource_version_at_least(_version(found), _version(written)):
            del self._written[(namespace, name)]  # confirmed, superseded, or gone
            return found
        return written

    def pending(self) -> list[Obj]:
        """The writes assumed now (some may be confirmed already: a superset)."""
        return list(self._written.values())

    def objects(self) -> Sequence[Obj]:
        listed = self._store().list()
        if not self._written:
            return listed
        return [found for obj in listed if (found := self.get(*_key(obj))) is not None]


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class _Objects(Mapping[DeviceKey, Obj]):
    """The GPUDevice store as a mapping by key, the binder's own writes assumed: what a pass reads of the
    raw devices (and the resourceVersions its writes are preconditioned on), without copying them."""

    def __init__(self, store: Store, assumed: Assumed) -> None:
        self._store = store
        self._assumed = assumed

    def __getitem__(self, key: DeviceKey) -> Obj:
        found = self._assumed.get(*key)
        if found is None:
            raise KeyError(key)
        return found

    def __iter__(self) -> Iterator[DeviceKey]:
        return iter([_key(o) for o in self._store.list()])

    def __len__(self) -> int:
        return len(self._store)


class StaleWrites(errors.Conflict):
    """Some writes of the pass were refused on their resourceVersion: the pass is requeued, not failed."""

    def __init__(self, count: int) -> None:
        super().__init__(409, {"reason": "Conflict", "message": f"{count} write(s) refused on the resourceVersion "
                               "they were decided on; the pass runs again from a fresh view"})


class Binder:
    """The leader's passes over the shared cache (see the module docstring)."""

    def __init__(self, cache: Cache, client: Client, config: BinderConfig, *, clock: Clock,
                 metrics: BinderMetrics | None = None) -> None:
        self._cache = cache
        self._client = client
        self._config = config
        self._clock = clock
        self._metrics = metrics
        self._live = LiveSnapshot(hoster_names=config.hoster_names, report_stale_after=config.report_stale_after,
                                  launcher_grace=config.launcher_grace, on_invalid=self._invalid)
        #: The full pass asked for when the first open launcher window closes, and when that is.
        self._window_reminder: tuple[datetime, Cancellable] | None = None
        #: When the binder first saw an attachment that carries no time (R-BIND-8's grace starts then).
        self._first_seen: dict[DeviceKey, datetime] = {}
        #: The stores the always-on reconcilers last ran clean on (``_reconcile_inputs``).
        self._reconciled: tuple[object, ...] | None = None
        #: Devices whose ``AttachmentVerified`` is False, kept from the device events (no scan of every device).
        self._unverified: set[DeviceKey] = set()
        #: Unanswered bind requests: id -> when this replica first saw it (answer latency).
        self._requests: dict[tuple[DeviceKey, str], float] = {}
        self._on_request: Callable[[], None] | None = None
        #: Reports: when each object's was last sent (its status path -> clock), the reminder for those
        #: held back, and what asks the driver for the full pass that writes them.
        self._reported: dict[str, float] = {}
        self._report_memo = reports.ReportMemo()
        self._report_reminder: Cancellable | None = None
        self._on_full_pass_due: Callable[[str], None] | None = None
        #: Writes of this pass refused on their resourceVersion (or whose object vanished).
        self._stale = 0
        #: The Events of its writes, sent off the placement path (``run`` it beside the passes).
        self.events = EventRecorder(client, instance=config.identity, capacity=config.event_queue,
                                    on_dropped=self._events_dropped)
        #: The binder's own placement writes the cache has not shown yet (read back until it does).
        self._assumed = Assumed(lambda: self._cache.store(specs.GPU_DEVICES))
        #: The last placement cycle whose writes were all done: what the next one's view is taken against.
        self._planned: Planned | None = None
        self._whole_at = datetime.min.replace(tzinfo=UTC)
        #: When the live model was last checked against a build from the stores (``verify_model``).
        self._verified_at = datetime.min.replace(tzinfo=UTC)
        for spec in self.kinds:
            cache.add(spec)
        #: Which attached devices the next pass judges (the unsettled ones and those that changed).
        self._attachment_watch = attachments.AttachmentWatch()
        #: What the finalizers look at again, kept from the device and VMI events.
        self._finalizer_work = finalizers.FinalizerWork()
        unsubscribe = [cache.informer(specs.GPU_DEVICES).subscribe(self._device_changed),
                       cache.informer(specs.VMIS).subscribe(lambda _event: self._finalizer_work.vmi())]
        self._unverified = {_key(obj) for obj in self._devices_or_empty() if _unverified(obj)}  # a cache already up
        if config.gpu_enabled:
            for kind, spec in specs.SNAPSHOT_SPECS.items():
                unsubscribe.append(cache.informer(spec).subscribe(self._live.handler(kind)))
            unsubscribe.append(cache.informer(specs.GPU_NODES).subscribe(
                lambda event: self._report_memo.changed(_key(event.obj)[1])))
        self._unsubscribe = unsubscribe

    # -- what it reads --------------------------------------------------------------------

    @property
    def kinds(self) -> tuple[KindSpec, ...]:
        """Every kind whose change is a reason for a full pass."""
        reconciler = (specs.GPU_CLASSES, specs.GPU_DEVICES, specs.VMIS, WORKLOAD_MONITORS, WORKLOADS)
        if not self._config.gpu_enabled:
            return reconciler
        return (*reconciler, specs.GPU_NODES, specs.NODES, specs.PODS, specs.NAMESPACES, specs.TENANT_QUOTAS,
                specs.KUBEVIRTS)

    #: Chatty kinds whose changes start a full pass only when a decision reads what moved (heartbeats,
    #: quota usage, pods that use no GPU and the binder's own GPUNode reports start none).
    _FILTERED: tuple[str, ...] = ("Node", "Pod", "ResourceQuota", keys.GPUNODE_KIND)

    def worth_a_pass(self) -> dict[str, Callable[[Event], bool]]:
        """Kind key -> whether one of its events is a reason for a full pass (``Cache.trigger``'s ``when``).

        A GPUClass event is one unless it changed only the status (the binder's own class report): the
        class finalizer work reads the finalizers and the deletion, placement the spec.
        """
        filters: dict[str, Callable[[Event], bool]] = {specs.GPU_CLASSES.key: _class_changed}
        if not self._config.gpu_enabled:
            return filters
        live = self._live

        def predicate(kind: str) -> Callable[[Event], bool]:
            return lambda event: live.matters(kind, event.old, None if event.type == "DELETED" else event.obj)

        return filters | {specs.SNAPSHOT_SPECS[kind].key: predicate(kind) for kind in self._FILTERED}

    def on_request(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (the driver's answer lane) whenever a device carries a new unanswered request."""
        self._on_request = callback
        if any(_unanswered(obj) for obj in self._devices_or_empty()):
            callback()

    def on_full_pass_due(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(why)`` (the driver's full lane) when time makes a full pass due: reports held back
        by ``report_every``, or a launcher window closing."""
        self._on_full_pass_due = callback

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        if self._report_reminder is not None:
            self._report_reminder.cancel()
            self._report_reminder = None
        if self._window_reminder is not None:
            self._window_reminder[1].cancel()
            self._window_reminder = None

    def _device_changed(self, event: Event) -> None:
        self._finalizer_work.device(event.old, None if event.type == "DELETED" else event.obj)
        if event.type != "DELETED" and _unverified(event.obj):
            self._unverified.add(_key(event.obj))
        else:
            self._unverified.discard(_key(event.obj))
        request_id = _unanswered(event.obj) if event.type != "DELETED" else ""
        if request_id and request_id != _unanswered(event.old):
            self._requests.setdefault((_key(event.obj), request_id), self._clock.now())
        elif not (event.old is None and _new_order(event.obj)):
            return  # neither a new request nor a new order: nothing for the very next cycle
        if self._on_request is not None and self._config.gpu_enabled:
            self._on_request()

    def _devices_or_empty(self) -> Sequence[Obj]:
        try:
            return self._cache.store(specs.GPU_DEVICES).list()
        except (KindNotServed, NotSynced):
            return []

    # -- the snapshot -----------------------------------------------------------------------

    def _optional(self, spec: KindSpec) -> Sequence[Obj] | None:
        """The kind's objects, or None while it is not served (never an empty list then)."""
        try:
            return self._cache.store(spec).list()
        except KindNotServed:
            return None

    def snapshot(self) -> tuple[Snapshot, Mapping[DeviceKey, Obj], bool]:
        """The snapshot of this instant, the raw devices it was built from, and whether VMIs are served.

        Kept up to date from the cache's events (``LiveSnapshot``): a pass
        after a bind request converts and re-derives only what changed. The
        raw devices are the store itself, read by key.
        """
        sources = self._sources()
        snapshot = self._live.snapshot(now=self._clock.wall(), sources=sources)
        self._remind_window(snapshot.window_closes, snapshot.now)
        devices = self._cache.store(specs.GPU_DEVICES)
        return snapshot, _Objects(devices, self._assumed), sources["VirtualMachineInstance"] is not None

    def _sources(self) -> dict[str, Source | None]:
        """Each snapshot kind's store (None while the VMI or KubeVirt kind is not served)."""
        sources: dict[str, Source | None] = {}
        for kind, spec in specs.SNAPSHOT_SPECS.items():
            try:
                store = self._cache.store(spec)
            except KindNotServed:
                if spec not in (specs.VMIS, specs.KUBEVIRTS):
                    raise
                sources[kind] = None
                continue
            if spec == specs.GPU_DEVICES:  # the binder's own writes assumed
                sources[kind] = Source(store, self._assumed.objects, self._assumed.get)
            else:
                sources[kind] = Source(store, store.list, store.get)
        return sources

    async def verify_model(self) -> str | None:
        """The safety net (R-BIND-1): the model built again from the stores, compared with the live one.

        A difference is counted (``cozygpu_read_model_drift_total``), logged with the first differing
        field and key, and repaired: the next snapshot is built from the stores.
        """
        drift = await self._live.verify(now=self._clock.wall(), sources=self._sources())
        if drift is not None:
            log.warning("the live read model drifted from the stores; rebuilt", first_difference=drift)
            if self._metrics is not None:
                self._metrics.drift.inc()
        return drift

    def _events_dropped(self, reason: str, count: int) -> None:
        if self._metrics is not None:
            self._metrics.events_dropped.labels(reason=reason).inc(count)

    def _invalid(self, kind: str, obj: Mapping[str, Any], problem: str) -> None:
        meta = obj.get("metadata") or {}
        log.warning("object left out of the snapshot", kind=kind, namespace=meta.get("namespace"),
                    name=meta.get("name"), problem=problem)

    # -- the passes ---------------------------------------------------------------------------

    async def answer_pass(self, writes: Writes) -> None:
        """A placement cycle: bind requests answered and new orders bound, in R-BIND-5's order."""
        if not self._config.gpu_enabled:
            return
        self._stale = 0
        snapshot, objects, served = self.snapshot()
        await self._verify_attachments(snapshot, objects, served, writes)
        await self._place(snapshot, objects, writes, lane="answer", whole=False)
        self._requeue_if_stale()

    async def _place(self, snapshot: Snapshot, objects: Mapping[DeviceKey, Obj], writes: Writes, *,
                     lane: str, whole: bool) -> WriteReport:
        """R-BIND-5 in order over the sets whose inputs changed since the last cycle (``whole``: every set)."""
        last = None if whole else self._planned
        view, plan = plan_cycle(snapshot, last)
        self._planned = None  # until this cycle's writes are all done
        report = await self._write_plan(plan, view, objects, writes, lane=lane)
        if not report.requeue and report.error is None:
            self._planned = Planned.of(snapshot, view, plan, last)
        return report

    async def full_pass(self, writes: Writes) -> None:
        """A placement cycle, then attachments, reports and the always-on reconcilers."""
        self._stale = 0
        if self._config.gpu_enabled:
            snapshot, objects, served = self.snapshot()
            await self._verify_attachments(snapshot, objects, served, writes)
            # Now and then a plan over everything, whatever the view would keep.
            whole = self._planned is None or snapshot.now - self._whole_at >= self._config.whole_plan_every
            if whole:
                self._whole_at = snapshot.now
                self._report_memo.forget()
            report = await self._place(snapshot, objects, writes, lane="full", whole=whole)
            written = {w.key for w in report.written} | {d.key for d in report.dropped}
            await self._attachments(snapshot, objects, written, writes)
            # A report refused on its resourceVersion is not a reason to requeue: the agent reports often,
            # and the change that beat it is itself an event of a watched kind, which queues a pass.
            gpunodes = self._cache.store(specs.GPU_NODES)
            reported = await reports.apply_reports(self._client, self._due_reports(reports.report_writes(
                snapshot, self._cache.store(specs.GPU_CLASSES).list(), gpunodes.list(), now=snapshot.now,
                memo=self._report_memo, lookup=lambda name: gpunodes.get(None, name),
                limit=self._config.reports_per_pass)))
            by_kind = {keys.GPUCLASS_KIND: specs.GPU_CLASSES, keys.GPUNODE_KIND: specs.GPU_NODES}
            for kind, version in reported.versions:
                writes.record(by_kind[kind], version)
            if self._metrics is not None:
                self._metrics.observe_units(snapshot)
            if report.error is not None:
                raise report.error
            if snapshot.now - self._verified_at >= self._config.verify_every:
                self._verified_at = snapshot.now
                await self.verify_model()
        await self._reconcile(writes)
        self._requeue_if_stale()

    def _due_reports(self, candidates: Sequence[reports.StatusWrite]) -> list[reports.StatusWrite]:
        """The report writes due now (at most ``reports_per_pass``); the others wait for the reminder."""
        every, now = self._config.report_every.total_seconds(), self._clock.now()
        self._reported = {path: at for path, at in self._reported.items() if now - at < every}
        due: list[reports.StatusWrite] = []
        # GPUNodes the judgement left for later (its limit reached): the next full pass judges more of them.
        wait = 0.0 if self._report_memo.left else math.inf
        for write in candidates:
            last = self._reported.get(write.path)
            if last is not None:
                wait = min(wait, last + every - now)
            elif len(due) < self._config.reports_per_pass:
                due.append(write)
                self._reported[write.path] = now
            else:
                wait = 0.0  # the next full pass writes more, after the answer passes waiting
        if wait < math.inf and self._report_reminder is None:
            self._report_reminder = self._clock.call_later(max(wait, 0.0), self._reports_due)
        return due

    def _remind_window(self, closes: datetime | None, now: datetime) -> None:
        """Ask for a full pass when the first launcher window closes: its pod's GPUs may take a hold then."""
        if closes is None or (self._window_reminder is not None and self._window_reminder[0] <= closes):
            return
        if self._window_reminder is not None:
            self._window_reminder[1].cancel()
        delay = max((closes - now).total_seconds(), 0.0)
        self._window_reminder = (closes, self._clock.call_later(delay, self._window_closed))

    def _window_closed(self) -> None:
        self._window_reminder = None
        if self._on_full_pass_due is not None:
            self._on_full_pass_due("launcher window closed")

    def _reports_due(self) -> None:
        self._report_reminder = None
        if self._on_full_pass_due is not None:
            self._on_full_pass_due("reports due")

    def _requeue_if_stale(self) -> None:
        """A write refused on its resourceVersion was decided on a view no longer true: run again, fresh."""
        if self._stale:
            raise StaleWrites(self._stale)

    async def _write_plan(self, plan: PassPlan, snapshot: Snapshot, objects: Mapping[DeviceKey, Obj],
                          writes: Writes, *, lane: str) -> WriteReport:
        sets = plan_writes(plan, snapshot, objects, now=snapshot.now)
        report = await write_sets(self._client, sets,
                                  on_written=lambda write, version: self.events.record(write, version,
                                                                                       now=snapshot.now))
        for item in report.written:
            # Assumed: read back by the next cycle, which need not wait for the watch to show it.
            self._assumed.add(item.key, item.answer)
            self._live.changed(keys.GPUDEVICE_KIND, None, item.answer)
            writes.record(specs.GPU_DEVICES, item.resource_version, assumed=True)
        self._count(plan, report, lane)
        if report.dropped and self._metrics is not None:
            self._metrics.conflicts.inc(len(report.dropped))
        if report.error is not None and lane == "answer":
            raise report.error
        self._stale += len(report.dropped)
        return report

    def _count(self, plan: PassPlan, report: WriteReport, lane: str) -> None:
        answered = {w.key for w in report.written}
        now = self._clock.now()
        for (key, request_id), seen in list(self._requests.items()):
            obj = self._cache.store(specs.GPU_DEVICES).get(*key)
            if key in answered or obj is None or _unanswered(obj) != request_id:
                del self._requests[(key, request_id)]
                if key in answered and self._metrics is not None:
                    self._metrics.answer_latency.observe(now - seen)
        if self._metrics is not None:
            for action in plan.actions:
                self._metrics.decisions.labels(lane=lane, action=type(action).__name__).inc()

    async def _verify_attachments(self, snapshot: Snapshot, objects: Mapping[DeviceKey, Obj], served: bool,
                                  writes: Writes) -> None:
        """R-BIND-7: fail the pass, and say so on the devices, while attachments cannot be verified."""
        if served:
            return  # every attachment can be judged (what to detach is the full pass's, R-BIND-8)
        plan = attachments.plan_attachments(snapshot, vmis_served=served, grace=self._config.attachment_grace)
        if not plan.unverified:
            return
        error = attachments.AttachmentsUnverified(plan.unverified)
        condition = {"type": ATTACHMENT_VERIFIED, "status": "False", "reason": "VMIKindNotServed",
                     "message": "the device is attached and virtualmachineinstances.kubevirt.io is not served: "
                                "the binder cannot tell a running VM from a gone one, so it decides nothing "
                                "until the kind is served"}
        for key in plan.unverified:
            obj = objects[key]
            if _unverified(obj):
                continue
            merged = reports.merge_conditions((obj.get("status") or {}).get("conditions"), [condition], snapshot.now)
            try:
                answer = await self._client.merge_patch(device_status_path(key), {"status": {"conditions": merged}},
                                                        resource_version=str(obj["metadata"]["resourceVersion"]))
            except (errors.Conflict, errors.NotFound):
                continue
            writes.record_object(specs.GPU_DEVICES, answer)
        raise error

    async def _mark_verified(self, keys_: Sequence[DeviceKey], objects: Mapping[DeviceKey, Obj], writes: Writes,
                             now: datetime) -> None:
        """Flip ``AttachmentVerified`` back to True on devices the binder can judge again."""
        condition = {"type": ATTACHMENT_VERIFIED, "status": "True", "reason": "VMIKindServed",
                     "message": "virtualmachineinstances.kubevirt.io is served: the attachment is judged again"}
        for key in keys_:
            obj = objects[key]
            merged = reports.merge_conditions((obj.get("status") or {}).get("conditions"), [condition], now)
            try:
                answer = await self._client.merge_patch(device_status_path(key), {"status": {"conditions": merged}},
                                                        resource_version=str(obj["metadata"]["resourceVersion"]))
            except (errors.Conflict, errors.NotFound):
                self._stale += 1
                continue
            writes.record_object(specs.GPU_DEVICES, answer)

    async def _attachments(self, snapshot: Snapshot, objects: Mapping[DeviceKey, Obj], skip: Iterable[DeviceKey],
                           writes: Writes) -> None:
        # Only the attached devices whose verdict may have moved (the rest are settled: see attachments).
        judged = attachments.attached_devices(snapshot, self._attachment_watch.candidates(snapshot))
        for device in judged:
            if device.attachment is not None and device.attachment.attached_at is None:
                self._first_seen.setdefault(device.key, snapshot.now)
        for key in [k for k in self._first_seen if (d := snapshot.devices.get(k)) is None or d.attachment is None]:
            del self._first_seen[key]
        plan = attachments.plan_attachments(snapshot, vmis_served=True, grace=self._config.attachment_grace,
                                            first_seen=self._first_seen, skip=skip, attached=judged)
        self._attachment_watch.judged(snapshot, judged, plan, skip, clean=False)  # until its writes are done
        report = await attachments.apply_attachments(self._client, plan, objects)
        self._attachment_watch.judged(snapshot, judged, plan, skip, clean=not report.dropped)
        for version in report.written:
            writes.record(specs.GPU_DEVICES, version)
        self._stale += report.dropped
        done = {*skip, *(d.device for d in plan.detaches), *(a.device for a in plan.adopts)}
        await self._mark_verified(sorted(k for k in self._unverified if k not in done and k in objects), objects,
                                  writes, snapshot.now)
        if self._metrics is not None:
            for detach in plan.detaches:
                self._metrics.detaches.labels(reason=detach.reason, deleted=str(detach.delete).lower()).inc()

    def _reconcile_inputs(self) -> tuple[object, ...]:
        """What the always-on reconcilers read, as (store, resourceVersion) per kind: unchanged, nothing to do."""
        found: list[object] = []
        for spec in (specs.GPU_CLASSES, specs.GPU_DEVICES, specs.VMIS, WORKLOAD_MONITORS, WORKLOADS):
            try:
                store = self._cache.store(spec)
            except KindNotServed:
                found += [None, None]
                continue
            found += [store, store.resource_version]
        return tuple(found)

    async def _reconcile(self, writes: Writes) -> None:
        """The always-on reconcilers: finalizers and usage records (R-BIND-9).

        They read only classes, devices, VMIs and the usage kinds: when none of those stores moved since a
        run that left nothing stale, they have nothing to do (a Node label or a report walks no device).
        """
        inputs = self._reconcile_inputs()
        if inputs == self._reconciled:
            return
        if self._reconciled is None or inputs[0::2] != self._reconciled[0::2]:
            self._finalizer_work.everything()  # a first run, or a store replaced: no event says what moved
        stale_before = self._stale
        await self._reconcile_all(writes)
        self._reconciled = inputs if self._stale == stale_before else None

    async def _reconcile_all(self, writes: Writes) -> None:
        classes = self._cache.store(specs.GPU_CLASSES).list()
        vmis: Mapping[tuple[str, str], str] | None = None
        try:
            store = self._cache.store(specs.VMIS)
        except KindNotServed:
            pass  # every attachment counts as in use while the kind is not served (R-BIND-7)
        else:
            vmis = finalizers.VmiUids(store.get, store.list)
        # The binder's own placement writes read back (assumed): a finalizer patched on the version the
        # cache still shows would be refused by the status this very pass wrote.
        changes = self._finalizer_work.changes(classes, self._cache.store(specs.GPU_DEVICES).list,
                                               self._assumed.get, vmis, assumed=self._assumed.pending())
        done = await finalizers.apply_finalizers(self._client, changes)
        self._finalizer_work.done(stale=bool(done.stale))
        self._stale += len(done.stale)
        by_plural = {keys.GPUCLASS_PLURAL: specs.GPU_CLASSES, keys.GPUDEVICE_PLURAL: specs.GPU_DEVICES}
        for plural, version in done.versions:
            writes.record(by_plural[plural], version)
        monitors, workloads = self._optional(WORKLOAD_MONITORS), self._optional(WORKLOADS)
        if monitors is None or workloads is None:
            return  # Cozystack's usage kinds are not served here: nothing to record into
        devices = self._assumed.objects()
        recorded = await usage.apply_usage(self._client, usage.usage_plan(devices, classes, monitors, workloads))
        self._stale += recorded.stale
        by_kind = {WORKLOAD_MONITORS.kind: WORKLOAD_MONITORS, WORKLOADS.kind: WORKLOADS}
        for kind, version in recorded.versions:
            if kind in by_kind:
                writes.record(by_kind[kind], version)
