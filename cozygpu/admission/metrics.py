"""The webhooks' figures.

    cozygpu_admission_answers_total{webhook, outcome, reason}
                                                        answers: allowed, refused, error, bad-request; reason
                                                        is the refusal's (``metric_reason``), "" when allowed
    cozygpu_admission_duration_seconds{webhook}         request read → answer written
    cozygpu_admission_bind_wait_seconds{result}         bind request written → the binder's answer seen
    cozygpu_webhook_read_model_rebuilds_total{reason}   the process's read model (the webhooks') built again, by why
"""

from __future__ import annotations

from typing import Final

import attrs
from prometheus_client import CollectorRegistry, Counter, Histogram

from cozygpu.model.refusals import Reason

#: Seconds: a GPUDevice answer within 20 ms, a VMI answer (with the binder's) within 150 ms at the p99.
_BUCKETS: Final = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0)

#: The envelope's reasons for answers that are not a refusal of the request (``Verdict.not_ready``,
#: ``Verdict.internal_error``, a 400): every refusal's reason is a ``Reason`` (``model/refusals.py``).
REASON_NOT_READY: Final = "NotReady"
REASON_INTERNAL_ERROR: Final = "InternalError"
REASON_BAD_REQUEST: Final = "BadRequest"
ADMISSION_REASONS: Final = frozenset({REASON_NOT_READY, REASON_INTERNAL_ERROR, REASON_BAD_REQUEST})
#: Every value the ``reason`` label takes: the model's reasons, the webhooks' own, "" (allowed), Other.
METRIC_REASONS: Final = frozenset({str(r) for r in Reason}) | ADMISSION_REASONS | {"", "Other"}


def metric_reason(reason: str, *, allowed: bool) -> str:
    """The ``reason`` label of one answer: bounded, since a binder's answer reason is read from device status."""
    if allowed:
        return ""
    return reason if reason in METRIC_REASONS and reason else "Other"


@attrs.frozen
class AdmissionMetrics:
    answers: Counter
    latency: Histogram
    bind_wait: Histogram
    rebuilds: Counter

    @classmethod
    def on(cls, registry: CollectorRegistry) -> AdmissionMetrics:
        return cls(
            answers=Counter("cozygpu_admission_answers", "Admission answers, by webhook, outcome and refusal reason",
                            ("webhook", "outcome", "reason"), registry=registry),
            latency=Histogram("cozygpu_admission_duration_seconds", "From an AdmissionReview read to its answer",
                              ("webhook",), buckets=_BUCKETS, registry=registry),
            bind_wait=Histogram("cozygpu_admission_bind_wait_seconds", "From a bind request written to the "
                                "binder's answer seen in the cache (result: Succeeded, Failed, timeout)",
                                ("result",), buckets=_BUCKETS, registry=registry),
            rebuilds=Counter("cozygpu_webhook_read_model_rebuilds", "The webhooks' read model built again from "
                             "the stores (in slices), by why", ("reason",), registry=registry),
        )
