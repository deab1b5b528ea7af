"""What the binder's works share in a leader term: the cache, the client, the read model kept by the
cache's events, the placement writes assumed, the Event sender, the clock and the metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta

import attrs

from cozygpu.base.clock import Clock
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.binder.patcher import Sent, Write, send
from cozygpu.binder.recorder import DEFAULT_CAPACITY, EventRecorder
from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import KindNotServed
from cozygpu.cache.kinds import KindSpec
from cozygpu.kube import Client
from cozygpu.kube.client import Obj
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE, DEFAULT_REPORT_STALE_AFTER
from cozygpu.model.snapshot import DeviceKey, Snapshot
from cozygpu.passes.writes import Writes
from cozygpu.views import specs
from cozygpu.views.live import LiveSnapshot
from cozygpu.views.readmodel import Assumed, ReadModel


@attrs.frozen(kw_only=True)
class BinderConfig:
    identity: str
    gpu_enabled: bool = True
    attachment_grace: timedelta = timedelta(minutes=2)
    #: How long a pod that claims to be a VMI's launcher may go unproven before it can move a hold (R-MOD-7).
    launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE
    hoster_names: tuple[str, ...] = ()
    report_stale_after: timedelta = DEFAULT_REPORT_STALE_AFTER
    #: A placement pass plans over every set at least this often (otherwise over what could have changed).
    whole_plan_every: timedelta = timedelta(minutes=5)
    #: The live read model is checked against a build from the stores at least this often.
    verify_every: timedelta = timedelta(minutes=5)
    #: One GPUClass or GPUNode report is written at most this often; a change within it is written when
    #: it is over, by a report pass asked for then. Reports are for people: under a stream of orders, a
    #: report per order doubled the binder's writes.
    report_every: timedelta = timedelta(seconds=1)
    #: Events queued at most for sending off the placement path; more are dropped and counted.
    event_queue: int = DEFAULT_CAPACITY


def optional(cache: Cache, spec: KindSpec) -> Sequence[Obj] | None:
    """The kind's objects, or None while it is not served (never an empty list then)."""
    try:
        return cache.store(spec).list()
    except KindNotServed:
        return None


@attrs.define
class Context:
    """Shared by the works of one binder (see the module docstring). ``model`` is the process's read model
    (the webhooks' too), its device writes assumed over the cache while a term lasts."""

    cache: Cache
    client: Client
    config: BinderConfig
    clock: Clock
    metrics: BinderMetrics | None
    events: EventRecorder
    model: ReadModel

    @property
    def live(self) -> LiveSnapshot:
        return self.model.live

    @property
    def assumed(self) -> Assumed:
        return self.model.assumed

    def assume(self, write: Write, answer: Obj) -> bool:
        """A device the binder wrote, read back by every work until the cache shows it (``Assumed``): a
        work after the writer decides on it without waiting for the watch; other kinds are not assumed."""
        if write.kind != specs.GPU_DEVICES:
            return False
        self.model.assume(answer)
        return True

    async def send(self, writes: Iterable[Write], record: Writes, *, stop: Callable[[], bool] | None = None) -> Sent:
        """``patcher.send`` through this binder's client, its device writes assumed."""
        return await send(self.client, writes, record, stop=stop or (lambda: False), assume=self.assume)

    async def snapshot(self) -> tuple[Snapshot, Mapping[DeviceKey, Obj], bool]:
        """The snapshot of now, the raw devices it was built from (the store read by key, the binder's own
        writes assumed), and whether VMIs are served. Kept up to date from the cache's events: a pass
        converts and re-derives only what changed; a rebuild runs in slices, the event loop let go between."""
        snapshot = await self.model.snapshot()
        return snapshot, self.model.devices(), self.cache.is_served(specs.VMIS)
