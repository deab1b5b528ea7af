"""The webhooks' figures.

    cozygpu_admission_answers_total{webhook, outcome}   answers: allowed, refused, error, bad-request
    cozygpu_admission_duration_seconds{webhook}         request read → answer written
    cozygpu_admission_bind_wait_seconds{result}         bind request written → the binder's answer seen
"""

from __future__ import annotations

from typing import Final

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram

#: Seconds: a GPUDevice answer within 20 ms, a VMI answer (with the binder's) within 150 ms at the p99.
_BUCKETS: Final = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)


@attrs.frozen
class AdmissionMetrics:
    answers: Counter
    latency: Histogram
    bind_wait: Histogram

    @classmethod
    def on(cls, registry: CollectorRegistry) -> AdmissionMetrics:
        return cls(
            answers=Counter("cozygpu_admission_answers", "Admission answers, by webhook and outcome",
                            ("webhook", "outcome"), registry=registry),
            latency=Histogram("cozygpu_admission_duration_seconds", "From an AdmissionReview read to its answer",
                              ("webhook",), buckets=_BUCKETS, registry=registry),
            bind_wait=Histogram("cozygpu_admission_bind_wait_seconds", "From a bind request written to the "
                                "binder's answer seen in the cache (result: Succeeded, Failed, timeout)",
                                ("result",), buckets=_BUCKETS, registry=registry),
        )
