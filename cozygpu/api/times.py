"""RFC 3339 in and out: every timestamp cozygpu writes, and every one it reads."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(when: datetime) -> str:
    """Kubernetes Time (``metav1.Time``): RFC 3339 in UTC, whole seconds, ``Z``."""
    if when.tzinfo is None:
        raise ValueError("a naive datetime has no defined UTC time")
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(when: datetime) -> str:
    """Kubernetes MicroTime (``metav1.MicroTime``, Leases, events.k8s.io): RFC 3339 in UTC with microseconds."""
    if when.tzinfo is None:
        raise ValueError("a naive datetime has no defined UTC time")
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> datetime | None:
    """A timestamp a client wrote, in UTC; None for a missing or unreadable one (a naive one is taken as UTC)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
