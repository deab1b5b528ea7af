"""``python -m tests.runtime.term_controller MODE FLAGS...``: the controller with one misbehaving leader runnable.

For the term tests only (nothing in the package knows of it). MODE:

- ``ignores-cancellation``: the runnable swallows every cancellation and goes on;
- ``blocks-the-loop``: the runnable blocks the event loop with a synchronous sleep.

FLAGS are ``cozygpu controller``'s own.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from cozygpu.base.logging import get_logger
from cozygpu.runtime import command
from cozygpu.runtime.controller import Controller, LeaderRunnable

_log = get_logger("tests.term")


async def ignores_cancellation() -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _log.warning("stubborn work ignores its cancellation", event="stubborn-cancelled")


async def blocks_the_loop() -> None:
    _log.warning("stubborn work blocks the event loop", event="stubborn-blocking")
    await asyncio.sleep(0.2)  # let the line above reach the log writer
    time.sleep(3600)  # noqa: ASYNC251 - blocking the loop is the point


MODES: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
    "ignores-cancellation": ignores_cancellation,
    "blocks-the-loop": blocks_the_loop,
}


def main(argv: list[str]) -> int:
    mode, *flags = argv
    work = MODES[mode]

    def prepare(controller: Controller) -> None:
        controller.leader_runnables.append(LeaderRunnable(f"stubborn ({mode})", work))

    return command.main(flags, prepare=prepare)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
