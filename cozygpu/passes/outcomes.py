"""How a pass ended, decided once for every loop the driver runs.

    Outcome       raised by the pass                      what the driver does
    OK            nothing                                 resets the backoff
    REQUEUED      Conflict, AlreadyExists, NotFound,      runs the lane again soon (a short backoff of
                  TooManyRequests, ServerError,           its own), earlier if a request comes; not a
                  Unavailable: the view went stale or     failure
                  the server was briefly unable
    WAITING       KindNotServed, NotSynced: the cache     runs the lane again on the next request (a
                  cannot answer yet (R-RUN-3, R-BIND-7)   sync or served change fires the kind's
                                                          trigger) or after the failure backoff
    FAILED        any other error: an API refusal a       logs it (a bug with its traceback), counts
                  retry will not change (Forbidden,       it, and holds the lane for the failure
                  Invalid, ...) or a bug                  backoff; never ends the loop

``UnknownKind`` is a ``CacheError`` but a programming error: it fails.
Cancellation is not an outcome; it ends the loop.
"""

from __future__ import annotations

import enum

from cozygpu.cache.errors import KindNotServed, NotSynced
from cozygpu.kube import errors


class Outcome(enum.Enum):
    OK = "ok"
    REQUEUED = "requeued"
    WAITING = "waiting"
    FAILED = "failed"


#: API errors after which the same pass, run again from a fresh view, is expected to succeed.
_TRANSIENT: tuple[type[errors.KubeError], ...] = (
    errors.Conflict, errors.AlreadyExists, errors.NotFound, errors.TooManyRequests, errors.ServerError,
    errors.Unavailable,
)


def classify(error: Exception) -> Outcome:
    """The outcome of a pass that raised ``error``."""
    if isinstance(error, _TRANSIENT):
        return Outcome.REQUEUED
    if isinstance(error, KindNotServed | NotSynced):
        return Outcome.WAITING
    return Outcome.FAILED


def is_bug(error: Exception) -> bool:
    """Whether a failure is ours (logged with its traceback) rather than an API refusal."""
    return not isinstance(error, errors.KubeError)
