"""One classification of a pass's error for every loop: stale views requeue, an unready cache waits,
the rest fails, and only our own errors count as bugs."""

from __future__ import annotations

import pytest

from cozygpu.cache.errors import KindNotServed, NotSynced, UnknownKind
from cozygpu.kube import errors
from cozygpu.passes.outcomes import Outcome, classify, is_bug


def api(cls: type[errors.ApiError], status: int) -> errors.ApiError:
    return cls(status, {"reason": cls.__name__, "message": "refused"}, method="PUT", path="/api/v1/x")


@pytest.mark.parametrize(("error", "outcome"), [
    (api(errors.Conflict, 409), Outcome.REQUEUED),
    (api(errors.AlreadyExists, 409), Outcome.REQUEUED),
    (api(errors.NotFound, 404), Outcome.REQUEUED),
    (api(errors.ServerError, 500), Outcome.REQUEUED),
    (errors.Unavailable("connection refused"), Outcome.REQUEUED),
    (KindNotServed("virtualmachineinstances.v1.kubevirt.io", "no CRD"), Outcome.WAITING),
    (NotSynced("gpunodes.v1alpha1.gpu.cozystack.io"), Outcome.WAITING),
    (api(errors.Forbidden, 403), Outcome.FAILED),
    (api(errors.Invalid, 422), Outcome.FAILED),
    (UnknownKind("gpunodes"), Outcome.FAILED),
    (KeyError("spec"), Outcome.FAILED),
])
def test_a_pass_error_is_classified_once(error: Exception, outcome: Outcome) -> None:
    assert classify(error) is outcome


def test_only_errors_that_are_not_api_refusals_are_bugs() -> None:
    assert is_bug(KeyError("spec"))
    assert is_bug(UnknownKind("gpunodes"))
    assert not is_bug(api(errors.Forbidden, 403))
