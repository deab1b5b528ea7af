"""``deadline(clock, seconds)``: ``asyncio.timeout`` on a ``Clock``, so fake time can trip it.

Raises ``TimeoutError`` out of the block when ``seconds`` pass on ``clock``
before it finishes; ``seconds <= 0`` trips at the next await.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cozygpu.base.clock import Clock


@asynccontextmanager
async def deadline(clock: Clock, seconds: float) -> AsyncIterator[None]:
    async with asyncio.timeout(None) as scope:
        handle = clock.call_later(seconds, lambda: scope.reschedule(asyncio.get_running_loop().time()))
        try:
            yield
        finally:
            handle.cancel()
