"""Why a read from the cache was refused.

    CacheError
    ├── UnknownKind      no informer was added under that key (a programming error)
    ├── KindNotServed    the API server does not serve the kind (yet, or any more):
    │                    never an empty list, so "no VMIs" and "cannot see VMIs"
    │                    stay different answers (R-BIND-7, R-RUN-3)
    └── NotSynced        the kind is served (or not known to be unserved yet) and
                         its first list has not been stored: the answer would be
                         incomplete

A reader that gets either of the last two fails its pass and waits for the
informer's trigger; it does not treat the kind as empty.
"""

from __future__ import annotations


class CacheError(Exception):
    """Base of every refusal raised by cozygpu.cache."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(f"{kind}: {message}")


class UnknownKind(CacheError, KeyError):
    """No informer was added under this key."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind, "no informer was added for this kind")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class KindNotServed(CacheError):
    """The API server does not serve this kind; ``reason`` says what discovery found."""

    def __init__(self, kind: str, reason: str) -> None:
        self.reason = reason
        super().__init__(kind, f"not served: {reason}")


class NotSynced(CacheError):
    """The kind's first list has not been stored yet (or discovery has not answered)."""

    def __init__(self, kind: str, detail: str = "the first list has not been stored yet") -> None:
        self.detail = detail
        super().__init__(kind, f"not synced: {detail}")
