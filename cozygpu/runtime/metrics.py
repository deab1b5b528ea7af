"""The process's own Prometheus figures: leader election, readiness, the settings publisher.

Every figure lives on the registry the process passes in (never the global
one), so two processes in one test run, or two electors in one unit test,
never share a counter. The informer figures (watch restarts, relists, events,
store sizes) are the cache's own, registered by the cache on the same registry.
"""

from __future__ import annotations

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

from cozygpu.passes.metrics import PassMetrics


@attrs.frozen
class LeaderMetrics:
    is_leader: Gauge
    terms: Counter
    lost: Counter
    renew_failures: Counter
    last_renew: Gauge
    released: Counter

    @classmethod
    def on(cls, registry: CollectorRegistry) -> LeaderMetrics:
        return cls(
            is_leader=Gauge("cozygpu_leader_is_leader", "1 while this process holds the lease and leads",
                            registry=registry),
            terms=Counter("cozygpu_leader_terms", "Terms this process started leading", registry=registry),
            lost=Counter("cozygpu_leader_lost", "Terms that ended because a renewal failed or another holder "
                         "was seen", registry=registry),
            renew_failures=Counter("cozygpu_leader_attempt_failures", "Acquire or renew attempts that failed "
                                   "with an error or timed out", registry=registry),
            last_renew=Gauge("cozygpu_leader_last_renew_timestamp_seconds",
                             "When the lease was last acquired or renewed (Unix time)", registry=registry),
            released=Counter("cozygpu_leader_released", "Leases this process released on stopping",
                             registry=registry),
        )


@attrs.frozen
class SettingsMetrics:
    writes: Counter
    #: Passes that failed or waited for a cache (a requeue after a conflict is not one).
    failures: Counter
    #: The pass driver's figures, shared with every loop on the registry (``loop="settings-publisher"``).
    passes: PassMetrics

    @classmethod
    def on(cls, registry: CollectorRegistry) -> SettingsMetrics:
        return cls(
            writes=Counter("cozygpu_settings_writes", "Writes of the settings ConfigMap", registry=registry),
            failures=Counter("cozygpu_settings_write_failures", "Failed publishing passes of the settings "
                             "ConfigMap", registry=registry),
            passes=PassMetrics.on(registry),
        )


@attrs.frozen
class ProcessMetrics:
    ready: Gauge
    stage_up: Gauge

    @classmethod
    def on(cls, registry: CollectorRegistry) -> ProcessMetrics:
        return cls(
            ready=Gauge("cozygpu_ready", "1 while /readyz answers ready", registry=registry),
            stage_up=Gauge("cozygpu_stage_started", "1 while a start-up stage is running", ("stage",),
                           registry=registry),
        )
