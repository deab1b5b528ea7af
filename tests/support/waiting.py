"""Waiting on the API server in tests: poll a check until it holds, and fail saying what never happened."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(check: Callable[[], Awaitable[Any]], *, timeout: float = 30.0, what: str,
                     interval: float = 0.2) -> Any:
    """Poll ``check`` until it returns something truthy, and return that; after ``timeout``, fail with ``what``."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                if result := await check():
                    return result
                await asyncio.sleep(interval)
    except TimeoutError:
        raise AssertionError(what) from None
