"""The binder: separate works on one pass driver, in the leader term only (R-BIND-1…10).

Each work is a lane of the driver (``binder.loop``), which runs one pass at a
time, so decisions still serialize, in this order:

1. **placement** (``place.PlacementWork``): a placement cycle over the sets
   whose inputs changed; a bind request or a new order asks for one the
   moment it is seen (R-BIND-3). It reads its own writes back (assumed) and
   waits for no other work's writes;
2. **claims** (DRA hold claims, allocated right after a set is placed: a VM
   start waits for its claim), 3. **attachments**, 4. **ledger** (hold
   ledgers and idle-hold expiry), 5. **finalizers**, 6. **usage**,
   7. **reports** and 8. **verify** (``housekeeping``): each
   stops between writes when a
   placement pass is due, so an order waits behind one write of
   housekeeping, never behind all of it.

The works subscribe to the cache when the term starts (``term``) and drop
everything when it ends: a follower follows no events and keeps nothing.
Every write carries the resourceVersion its decision was made on (a deposed
leader's write fails on the newer version; leader election does not fence).

Without ``--enable-gpu`` only finalizers and usage records run (R-BIND-9).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from cozygpu import keys
from cozygpu.api import meta
from cozygpu.base.clock import Clock
from cozygpu.base.logging import get_logger
from cozygpu.binder import usage
from cozygpu.binder.context import BinderConfig, Context
from cozygpu.binder.housekeeping import (
    AttachmentsWork,
    ClaimsWork,
    FinalizersWork,
    LedgerWork,
    ReportsWork,
    Stop,
    UsageWork,
    VerifyWork,
)
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.binder.place import PlacementWork
from cozygpu.binder.recorder import EventRecorder
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import KindNotServed, NotSynced
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.store import Event
from cozygpu.kube import Client
from cozygpu.kube.client import Obj
from cozygpu.model.snapshot import DeviceKey, Snapshot
from cozygpu.passes.driver import Lane, Progress
from cozygpu.passes.keyed import KeyQueue
from cozygpu.passes.writes import Writes
from cozygpu.views import specs
from cozygpu.views.decode_dra import resource_claim_view
from cozygpu.views.readmodel import ReadModel

__all__ = ["LANES", "Binder", "BinderConfig"]

log = get_logger("cozygpu.binder")

#: The binder's lanes, in the order they go. Placement reads its own writes back and waits for no other
#: work's; every other work waits for the cache to show every write before it decides.
PLACEMENT = Lane("placement", reads_assumed=True, sees_others=False)
CLAIMS = Lane("claims")
ATTACHMENTS = Lane("attachments")
LEDGER = Lane("ledger")
FINALIZERS = Lane("finalizers")
USAGE = Lane("usage")
REPORTS = Lane("reports")
VERIFY = Lane("verify")
LANES = (PLACEMENT, CLAIMS, ATTACHMENTS, LEDGER, FINALIZERS, USAGE, REPORTS, VERIFY)


def _claim_worth_a_pass(event: Event) -> bool:
    """A ResourceClaim event, unless it is the binder's own hold claim made or allocated: the claims work
    wrote both in one pass and reads its answers itself, and placement reads the allocation from the live
    model when it next looks. Every one of them asked for a pass before, and placement then stopped the
    claims work between two holds: a burst of thirty orders had its claims written one or two a pass. Someone
    else's claim (it may free or take GPUs), a hold deallocated or deleted: a pass."""
    if event.type == "DELETED":
        return True
    new = resource_claim_view(event.obj)
    if not new.is_hold:
        return True
    return not (event.old is None or new.allocated)


def _class_changed(event: Event) -> bool:
    """Anything of a GPUClass but its status moved (or it came or went)."""
    old, new = event.old, event.obj
    if old is None or event.type == "DELETED":
        return True
    return (meta.spec(old) != meta.spec(new) or meta.finalizers(old) != meta.finalizers(new)
            or meta.deletion_time(old) != meta.deletion_time(new))


class Binder:
    """The binder's works over the shared cache (see the module docstring)."""

    def __init__(self, cache: Cache, client: Client, config: BinderConfig, *, clock: Clock,
                 metrics: BinderMetrics | None = None, model: ReadModel | None = None) -> None:
        """``model``: the process's read model, the webhooks' too (one of its own when None)."""
        self._cache = cache
        self._config = config
        #: The Events of its writes, sent off the placement path (``run`` it beside the passes).
        self.events = EventRecorder(client, instance=config.identity, capacity=config.event_queue,
                                    on_dropped=self._events_dropped)
        self._metrics = metrics
        if model is None:
            model = ReadModel(cache, hoster_names=config.hoster_names, report_stale_after=config.report_stale_after,
                              launcher_grace=config.launcher_grace, clock=clock, follow=config.gpu_enabled)
        if metrics is not None:
            model.on_rebuild(lambda why: metrics.rebuilds.labels(why).inc())
        model.on_invalid(self._invalid)
        self._context = Context(cache, client, config, clock, metrics, self.events, model)
        for spec in self.kinds:
            cache.add(spec)
        self.placement = PlacementWork(self._context)
        self.claims = ClaimsWork(self._context)
        self.attachments = AttachmentsWork(self._context)
        self.ledger = LedgerWork(self._context)
        self.finalizers = FinalizersWork(self._context)
        self.usage = UsageWork(self._context)
        self.reports = ReportsWork(self._context)
        self.verifier = VerifyWork(self._context)
        self._unsubscribe: list[Callable[[], None]] = []

    # -- the term -------------------------------------------------------------------------

    def start(self) -> None:
        """A term starts: the works follow the cache's events from now on (the read model follows them for
        the cache's life), with no write of an earlier term assumed."""
        if self._unsubscribe:
            return
        context, cache = self._context, self._cache
        context.model.forget_assumed()
        unsubscribe = [cache.informer(specs.GPU_DEVICES).subscribe(self._device_changed),
                       cache.informer(specs.VMIS).subscribe(self.finalizers.vmi_changed),
                       cache.informer(specs.GPU_CLASSES).subscribe(self._class_changed),
                       *(cache.informer(spec).subscribe(self.usage.changed)
                         for spec in (usage.WORKLOADS, usage.WORKLOAD_MONITORS))]
        if self._config.gpu_enabled:
            unsubscribe.append(cache.informer(specs.GPU_NODES).subscribe(self.reports.changed))
            unsubscribe.append(cache.informer(specs.RESOURCE_CLAIMS).subscribe(self.claims.claim_changed))
        self._unsubscribe = unsubscribe
        devices = self._listed(specs.GPU_DEVICES)
        self.attachments.started(devices)
        self.placement.started(devices)
        self.finalizers.started(devices, self._listed(specs.GPU_CLASSES))
        self.usage.started(devices, [*self._listed(usage.WORKLOADS), *self._listed(usage.WORKLOAD_MONITORS)])

    def close(self) -> None:
        """The term ends: no event is followed and nothing of the term is kept."""
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        for work in (self.placement, self.claims, self.attachments, self.ledger, self.finalizers, self.usage,
                     self.reports, self.verifier):
            work.stopped()
        self._context.model.forget_assumed()

    @contextlib.contextmanager
    def term(self) -> Iterator[None]:
        self.start()
        try:
            yield
        finally:
            self.close()

    def _device_changed(self, event: Event) -> None:
        self.finalizers.device_changed(event)
        self.usage.changed(event)
        self.attachments.device_changed(event)
        self.placement.device_changed(event)

    def _class_changed(self, event: Event) -> None:
        self.finalizers.class_changed(event)
        self.usage.class_changed(event)
        if self._config.gpu_enabled:
            self.reports.changed(event)

    def _listed(self, spec: KindSpec) -> list[Obj]:
        """The kind's objects now (none while it is not listed yet: its first list's events come then)."""
        try:
            return list(self._cache.store(spec).list())
        except (KindNotServed, NotSynced):
            return []

    # -- what it reads --------------------------------------------------------------------

    @property
    def kinds(self) -> tuple[KindSpec, ...]:
        """Every kind whose change is a reason for a pass (the works' trigger)."""
        reconciler = (specs.GPU_CLASSES, specs.GPU_DEVICES, specs.VMIS, usage.WORKLOAD_MONITORS, usage.WORKLOADS)
        if not self._config.gpu_enabled:
            return reconciler
        return (*reconciler, specs.GPU_NODES, specs.NODES, specs.PODS, specs.NAMESPACES, specs.TENANT_QUOTAS,
                specs.KUBEVIRTS, specs.RESOURCE_SLICES, specs.DEVICE_CLASSES, specs.RESOURCE_CLAIMS,
                specs.DEVICE_TAINT_RULES)

    #: Chatty kinds whose changes start a pass only when a decision reads what moved (heartbeats, quota
    #: usage, pods that use no GPU and the binder's own GPUNode reports start none).
    _FILTERED: tuple[str, ...] = ("Node", "Pod", "ResourceQuota", keys.GPUNODE_KIND)

    def worth_a_pass(self) -> dict[str, Callable[[Event], bool]]:
        """Kind key -> whether one of its events is a reason for a pass (``Cache.trigger``'s ``when``).

        A GPUClass event is one unless it changed only the status (the binder's own class report): the
        class finalizer work reads the finalizers and the deletion, placement the spec.
        """
        filters: dict[str, Callable[[Event], bool]] = {specs.GPU_CLASSES.key: _class_changed}
        if not self._config.gpu_enabled:
            return filters
        context = self._context

        def predicate(kind: str) -> Callable[[Event], bool]:
            return lambda event: context.live.matters(kind, event.old, None if event.type == "DELETED" else event.obj)

        return filters | {specs.SNAPSHOT_SPECS[kind].key: predicate(kind) for kind in self._FILTERED} | {
            specs.RESOURCE_CLAIMS.key: _claim_worth_a_pass}

    def on_request(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (the driver's placement lane) whenever a device carries a new unanswered
        request or a new order appears, and when a launcher window closes."""
        self.placement.on_request(callback)
        self.placement.on_window_closed(callback)

    def queues(self) -> dict[Lane, KeyQueue[Any]]:
        """Each keyed work's lane and its queue: a key whose time comes (a backoff over, a deadline, a grace)
        asks for that lane's pass (``KeyQueue.on_ready``)."""
        return {CLAIMS: self.claims.queue, ATTACHMENTS: self.attachments.queue, LEDGER: self.ledger.queue,
                FINALIZERS: self.finalizers.queue, USAGE: self.usage.queue, REPORTS: self.reports.queue}

    def lanes(self) -> dict[Lane, Callable[[Writes, Stop], Awaitable[Progress | None]]]:
        """Each lane's pass, in the order they go (``stop``: the driver's word that a lane before it is due)."""
        async def place(writes: Writes, _stop: Stop) -> None:
            await self.placement.run(writes)

        return {PLACEMENT: place, CLAIMS: self.claims.run, ATTACHMENTS: self.attachments.run, LEDGER: self.ledger.run,
                FINALIZERS: self.finalizers.run, USAGE: self.usage.run, REPORTS: self.reports.run,
                VERIFY: self.verifier.run}

    # -- for a caller without a driver (tests, benchmarks) ---------------------------------------

    @property
    def model(self) -> ReadModel:
        """The read model it decides on (the process's, when the controller shares one with the webhooks)."""
        return self._context.model

    async def snapshot(self) -> tuple[Snapshot, Mapping[DeviceKey, Obj], bool]:
        """The snapshot of now, the raw devices it was built from, and whether VMIs are served."""
        return await self._context.snapshot()

    async def verify_model(self) -> str | None:
        """The safety net now (``VerifyWork.verify``): the first difference, or None."""
        return await self.verifier.verify()

    def _events_dropped(self, reason: str, count: int) -> None:
        if self._context.metrics is not None:
            self._context.metrics.events_dropped.labels(reason=reason).inc(count)

    def _invalid(self, kind: str, obj: Mapping[str, Any], problem: str) -> None:
        namespace, name = meta.key(obj)
        log.warning("object left out of the snapshot", kind=kind, namespace=namespace, name=name, problem=problem)
