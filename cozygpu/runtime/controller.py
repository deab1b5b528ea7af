"""The controller process assembled: what runs, in which order, on which replicas (R-RUN-1…5).

Start order (``Supervisor`` stops them in reverse on SIGTERM):

1. ``servers``: ``/healthz`` and ``/readyz`` (plain HTTP) and ``/metrics``
   (HTTPS, for a caller the API server allows it), so probes and scrapes
   answer from the first second (readiness says why it is not ready).
2. ``caches``: the informers the webhooks read, on every replica; the stage
   is up once those have synced (never waiting for KubeVirt's kinds, which
   start whenever their CRDs are served).
3. ``webhooks`` (``--enable-gpu`` only): the HTTPS admission server.
4. ``leader-election``: campaigns for the Lease; while leading, runs every
   runnable of ``leader_runnables`` in one task group, all cancelled the moment
   the lease is lost, and all finished before the lease is released.

A term ends for real: a lost lease fails the ``leader-election`` stage, so the
process stops and exits 1 instead of campaigning again with whatever state its
runnables kept (Kubernetes starts it afresh). Leader work that is still running
``lease_duration - renew_deadline`` after its term ended, or at the lease's end
because it blocks the event loop, makes ``watchdog`` end the process hard
(``os._exit(1)`` from its own thread). A SIGTERM stop that finishes in time
releases the lease and exits 0.

Extension point: ``Controller.leader_runnables`` is the list of leader-only
work: the settings publisher and the binder (``cozygpu.binder``: placement
with GPU, the finalizers and usage records always). Append a
``LeaderRunnable`` before ``run()`` to add more. Work that runs on every replica (the
webhooks' handlers) hangs off ``webhook_app`` and the shared ``cache``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any, Final

import attrs
from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.admission.webhooks import AdmissionConfig, AdmissionWebhooks
from cozygpu.base.clock import Clock, LoopClock
from cozygpu.base.logging import get_logger
from cozygpu.binder.binder import Binder, BinderConfig
from cozygpu.binder.loop import NAME as BINDER
from cozygpu.binder.loop import binder_driver
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.cache.cache import Cache
from cozygpu.kube import Client
from cozygpu.runtime import kinds
from cozygpu.runtime.flags import Address, Options
from cozygpu.runtime.gcpauses import GcPauses
from cozygpu.runtime.leader import ElectionConfig, LeaderElector
from cozygpu.runtime.ledger_metrics import LedgerMetrics
from cozygpu.runtime.looplag import LoopLag
from cozygpu.runtime.metrics import LeaderMetrics, ProcessMetrics, SettingsMetrics
from cozygpu.runtime.metrics_auth import ApiReviewer, ScrapeAuth
from cozygpu.runtime.process import Stage, Supervisor, Watchdog
from cozygpu.runtime.selfsigned import self_signed_context
from cozygpu.runtime.servers import SCRAPE_LIMITS, Endpoint, Readiness, metrics_app, probe_app, serve
from cozygpu.runtime.settings import SettingsPublisher
from cozygpu.runtime.webhook import ServingCertificate, webhook_app
from cozygpu.views.readmodel import ReadModel

_log = get_logger("cozygpu.controller")

#: How long a stop (SIGTERM) may take: under Kubernetes' default 30 s termination grace period.
SHUTDOWN_GRACE: Final = 25.0


async def stop_leader_work(tasks: list[asyncio.Task[None]], *, limit: float,
                           on_overrun: Callable[[list[str]], None], clock: Clock | None = None) -> None:
    """Cancel ``tasks`` and wait for them; call ``on_overrun`` once if any outlives ``limit`` seconds.

    The tasks are always awaited to the end, even if this wait is cancelled
    again (then the cancellation is re-raised afterwards): no task outlives its
    owner. The overrun callback is how the owner learns it must end the whole
    process (the controller's ends it hard). An error a task raises while
    stopping is logged, not lost.
    """
    for task in tasks:
        task.cancel()
    time_source: Clock = clock if clock is not None else LoopClock()

    def overran() -> None:
        if names := sorted(task.get_name() for task in tasks if not task.done()):
            on_overrun(names)

    overrun = time_source.call_later(limit, overran)
    cancelled_again = False
    try:
        while pending := [task for task in tasks if not task.done()]:
            try:
                await asyncio.wait(pending)
            except asyncio.CancelledError:
                cancelled_again = True
    finally:
        overrun.cancel()
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            _log.error("leader work failed while stopping", runnable=task.get_name(), exc_info=task.exception())
    if cancelled_again:
        raise asyncio.CancelledError


@attrs.frozen
class LeaderRunnable:
    """Leader-only work: ``run()`` starts with each term and is cancelled when it ends."""

    name: str
    run: Callable[[], Coroutine[Any, Any, None]]


class Controller:
    """One replica of the controller, built from validated options and an API client."""

    def __init__(self, options: Options, client: Client, *, shutdown_grace: float = SHUTDOWN_GRACE) -> None:
        self.options = options
        self.client = client
        self.registry = CollectorRegistry()
        self.process_metrics = ProcessMetrics.on(self.registry)
        self.cache = Cache(client, registry=self.registry)
        self.webhook_kinds = kinds.webhook_kinds(enable_gpu=options.enable_gpu, namespace=options.namespace)
        for spec in (*self.webhook_kinds, *kinds.lazy_kinds(enable_gpu=options.enable_gpu)):
            self.cache.add(spec)
        self.readiness = Readiness(self.process_metrics)
        #: Who may read /metrics: the API server reviews each caller's token (R-LEDGER-3).
        self.scrape_auth = ScrapeAuth(ApiReviewer(client), registry=self.registry)
        self.webhook_app = webhook_app() if options.enable_gpu else None
        #: The one read model of the process, the webhooks' and the binder's (with GPU; none is read without).
        self.model = ReadModel(self.cache, hoster_names=options.gpu_resource_names,
                               launcher_grace=dt.timedelta(seconds=options.launcher_grace)) \
            if options.enable_gpu else None
        #: The GPUDevice, VMI and launcher-pod webhooks, on every replica, over the shared cache (R-ADM).
        self.admission: AdmissionWebhooks | None = None
        if self.webhook_app is not None:
            self.admission = AdmissionWebhooks(self.cache, client, AdmissionConfig(
                namespace=options.namespace, bind_wait=options.bind_wait, timeout=options.webhook_timeout,
                raw_names=options.raw_gpu_names, attachment_grace=dt.timedelta(seconds=options.attachment_grace),
                launcher_grace=dt.timedelta(seconds=options.launcher_grace),
                hoster_names=options.gpu_resource_names), registry=self.registry, model=self.model)
            self.admission.install(self.webhook_app)
        #: The hold ledger's figures, on every replica from its webhook model (R-LEDGER-1).
        self.ledger_metrics = LedgerMetrics(self.admission.source.snapshot) if self.admission is not None else None
        #: How late the event loop runs, on every replica (``cozygpu_event_loop_lag_seconds``).
        self.loop_lag = LoopLag(self.registry)
        #: How long each garbage collection held the process (``cozygpu_gc_pause_seconds``): a lag it explains.
        self.gc_pauses = GcPauses(self.registry)
        #: Ends the process hard when leader work outlives its term (armed by the elector).
        self.watchdog = Watchdog()
        self.elector = LeaderElector(
            client,
            ElectionConfig(namespace=options.namespace, name=keys.LEADER_LEASE, identity=options.identity,
                           lease_duration=options.lease_duration, renew_deadline=options.renew_deadline,
                           retry_period=options.retry_period),
            metrics=LeaderMetrics.on(self.registry), guard=self.watchdog,
        )
        #: Leader work writes through this client: nothing is sent once the term is over (a fence by the
        #: local clock, for a process that was frozen mid-pass), beside the resourceVersion on each write.
        leader_client = client.fenced(self.elector.write_fence)
        publisher = SettingsPublisher(
            leader_client, self.cache, namespace=options.namespace, hoster_names=options.gpu_resource_names,
            raw_names=options.raw_gpu_names, gpu_enabled=options.enable_gpu,
            metrics=SettingsMetrics.on(self.registry),
        )
        #: Leader-only work, started in this order each term (the binder joins here).
        #: The one writer of placement (with GPU) and the always-on reconcilers (with or without).
        self.binder_metrics = BinderMetrics.on(self.registry)
        self.binder = Binder(self.cache, leader_client, BinderConfig(
            identity=options.identity, gpu_enabled=options.enable_gpu,
            attachment_grace=dt.timedelta(seconds=options.attachment_grace),
            launcher_grace=dt.timedelta(seconds=options.launcher_grace),
            hoster_names=options.gpu_resource_names), clock=LoopClock(), metrics=self.binder_metrics,
            model=self.model)
        self.binder_driver = binder_driver(self.binder, self.cache, registry=self.registry)
        self.leader_runnables: list[LeaderRunnable] = [LeaderRunnable(publisher.name, publisher.run),
                                                       LeaderRunnable(BINDER, self.binder_driver.run)]
        #: Where each server ended up listening (port 0 picks one).
        self.bound: dict[str, Address] = {}
        self._webhook_serving = False
        self.supervisor = Supervisor(self._stages(), grace=shutdown_grace, metrics=self.process_metrics)
        self._readiness_checks()

    # -- readiness ------------------------------------------------------------------------

    def _readiness_checks(self) -> None:
        self.readiness.add("shutdown", lambda: "the process is stopping" if self.supervisor.stopping else None)
        self.readiness.add("caches", self._caches_synced)
        if self.options.enable_gpu:
            self.readiness.add("webhooks", lambda: None if self._webhook_serving else "not serving yet")

    def _caches_synced(self) -> str | None:
        waiting = [spec.key for spec in self.webhook_kinds if not self.cache.has_synced(spec)]
        return f"not synced: {', '.join(waiting)}" if waiting else None

    # -- stages ---------------------------------------------------------------------------

    def _stages(self) -> list[Stage]:
        stages = [Stage("loop-lag", self._run_loop_lag), Stage("servers", self._run_servers),
                  Stage("caches", self._run_caches)]
        if self.options.enable_gpu:
            stages.append(Stage("webhooks", self._run_webhooks))
        stages.append(Stage("leader-election", self._run_leader_election))
        return stages

    def _on_bound(self, name: str, address: Address) -> None:
        self.bound[name] = address

    async def _run_loop_lag(self, ready: Callable[[], None]) -> None:
        with self.gc_pauses.installed():
            ready()
            await self.loop_lag.run()

    async def _run_servers(self, ready: Callable[[], None]) -> None:
        certificate = ServingCertificate(self.options.metrics_cert_dir) if self.options.metrics_cert_dir else None
        if certificate is not None:
            context = await certificate.load()
        else:
            context = await self._self_signed_metrics_context()
        before = self.ledger_metrics.refresh if self.ledger_metrics is not None else None
        after = [self.binder_metrics.per_node.exposition]
        if self.ledger_metrics is not None:
            after.append(self.ledger_metrics.exposition)
        scrape = metrics_app(self.registry, self.scrape_auth, before=before, after=after)
        endpoints = [Endpoint("health", self.options.health_addr, probe_app(self.readiness)),
                     Endpoint("metrics", self.options.metrics_addr, scrape, context, SCRAPE_LIMITS)]
        async with asyncio.TaskGroup() as group:
            if certificate is not None:
                group.create_task(certificate.follow(), name="metrics certificate")
            await serve(endpoints, ready, on_bound=self._on_bound)

    async def _self_signed_metrics_context(self) -> ssl.SSLContext:
        """A certificate made now, in a thread (key generation is CPU work), for this host's names."""
        bound = self.options.metrics_addr.host
        hosts = ["localhost", socket.gethostname(), "127.0.0.1", "::1"]
        if bound not in ("", "0.0.0.0", "::"):
            hosts.append(bound)
        context, _ = await asyncio.to_thread(self_signed_context, hosts)
        _log.info("serving /metrics with a self-signed certificate made at start (no --metrics-cert-dir)")
        return context

    async def _run_caches(self, ready: Callable[[], None]) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.cache.run(), name="cache")
            _log.info("waiting for the webhook caches to sync", kinds=[spec.key for spec in self.webhook_kinds])
            await self.cache.wait_synced(*self.webhook_kinds)
            _log.info("webhook caches synced")
            ready()
            await asyncio.Future()

    async def _run_webhooks(self, ready: Callable[[], None]) -> None:
        assert self.webhook_app is not None
        assert self.options.cert_dir is not None
        certificate = ServingCertificate(self.options.cert_dir)
        context = await certificate.load()

        def serving() -> None:
            self._webhook_serving = True
            ready()

        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(certificate.follow(), name="webhook certificate")
                await serve([Endpoint("webhooks", self.options.webhook_addr, self.webhook_app, context)], serving,
                            on_bound=self._on_bound)
        finally:
            self._webhook_serving = False

    async def _run_leader_election(self, ready: Callable[[], None]) -> None:
        ready()
        await self.elector.run(self._lead)

    async def _lead(self) -> None:
        """One term of leader work: every leader runnable, all stopped together.

        The two log lines bracket the leader work exactly (the second is written
        after every runnable has finished), with the host's monotonic clock, so
        a test can prove that two replicas never ran leader work at once.

        When the term ends (the elector cancels this task) the runnables are
        cancelled and have ``lease_duration - renew_deadline`` to unwind: the
        time before another replica may take the lease. Work that is still
        running then is a hazard (leader election does not fence), so the
        watchdog ends the process hard (exit 1) rather than let it act beside
        the next leader; it does so too, from its own thread, if the work
        blocks the event loop past the lease's end.
        """
        identity = self.options.identity
        _log.info("leader-work-started", event="leader-work-started", identity=identity, monotonic=time.monotonic())
        tasks = [asyncio.create_task(r.run(), name=f"leader {r.name}") for r in self.leader_runnables]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a runnable that failed ends the term with its error
            raise RuntimeError(f"leader work {next(iter(done)).get_name()!r} ended on its own")
        finally:
            limit = self.options.lease_duration - self.options.renew_deadline
            await stop_leader_work(tasks, limit=limit, on_overrun=self._leader_work_overran)
            _log.info("leader-work-stopped", event="leader-work-stopped", identity=identity,
                      monotonic=time.monotonic())

    def _leader_work_overran(self, names: list[str]) -> None:
        _log.error("leader work did not stop before another replica may lead", runnables=names)
        self.watchdog.expire(f"leader work overran its term: {', '.join(names)}")

    # -- running --------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        self.supervisor.stop(reason)

    async def run(self) -> bool:
        """Run until stopped; True when every stage stopped cleanly."""
        _log.info("starting", identity=self.options.identity, namespace=self.options.namespace,
                  enable_gpu=self.options.enable_gpu)
        try:
            return await self.supervisor.run()
        finally:
            self.watchdog.close()
