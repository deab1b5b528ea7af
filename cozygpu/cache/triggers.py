"""Coalescing triggers: many events, one wake-up (R-BIND-1).

A ``Trigger`` is a flag with a waiter. ``fire(reason)`` sets it and records
the reason (the kind key, usually); ``await wait()`` returns as soon as it is
set, clears it and hands back every reason gathered since the last wait. A
burst of ten thousand events while a pass runs therefore costs one more pass,
not ten thousand.

Ordering: a fire that happens before ``wait()`` returns is part of that
wake-up; one that happens after it (even while the caller is still working on
the previous wake-up) makes the next ``wait()`` return at once. No event is
lost between two waits, and ``fire`` never blocks or awaits, so informers call
it inline from their read loop.

A trigger has one consumer (one loop awaiting it); give each loop its own.
"""

from __future__ import annotations

import asyncio


class Trigger:
    """A coalescing wake-up flag (see the module docstring)."""

    def __init__(self, name: str = "trigger") -> None:
        self.name = name
        self._event = asyncio.Event()
        self._reasons: set[str] = set()
        self.fired = 0
        self.woken = 0

    def fire(self, reason: str = "") -> None:
        """Ask for one more wake-up; cheap, synchronous, never blocks."""
        self.fired += 1
        if reason:
            self._reasons.add(reason)
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> frozenset[str]:
        """Wait until fired, clear, and return the reasons gathered since the last wait."""
        await self._event.wait()
        return self._take()

    def poll(self) -> frozenset[str] | None:
        """The reasons if fired (clearing it), else None, without waiting."""
        return self._take() if self._event.is_set() else None

    def _take(self) -> frozenset[str]:
        self._event.clear()
        reasons = frozenset(self._reasons)
        self._reasons.clear()
        self.woken += 1
        return reasons

    def __repr__(self) -> str:
        return f"Trigger({self.name!r}, set={self.is_set()}, fired={self.fired}, woken={self.woken})"
