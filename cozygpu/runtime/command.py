"""``cozygpu controller``: parse and check the flags, then run one replica on uvloop.

Exit codes: 0 after a clean stop (SIGTERM, SIGINT), 1 when a part failed,
the lease was lost, the stop overran its grace period or the watchdog ended
the process, 2 for bad flags (checked before anything
touches the network; the message names the flag, the value and the rule).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Sequence

import uvloop

from cozygpu.base.logging import configure, get_logger
from cozygpu.kube import Client
from cozygpu.runtime import flags
from cozygpu.runtime.controller import Controller

_log = get_logger("cozygpu.command")


def main(argv: Sequence[str], *, prepare: Callable[[Controller], None] | None = None) -> int:
    """Run one replica; ``prepare`` (tests only) may add to the controller before it runs."""
    try:
        options = flags.parse(argv)
    except flags.FlagError as err:
        print(f"cozygpu controller: {err}", file=sys.stderr)
        return 2
    except SystemExit as done:  # --help
        return int(done.code or 0)
    stop_logging = configure(fmt=options.log_format, level=options.log_level)
    try:
        return uvloop.run(_run(options, prepare))
    finally:
        stop_logging()


async def _run(options: flags.Options, prepare: Callable[[Controller], None] | None) -> int:
    try:
        client = await Client.auto(options.kubeconfig, user_agent=f"cozygpu-controller/{options.identity}")
    except Exception as err:  # kubernetes-asyncio's ConfigException, a missing file, a bad certificate
        _log.error("cannot load the Kubernetes client configuration", kubeconfig=options.kubeconfig,
                   error=f"{type(err).__name__}: {err}")
        return 1
    async with client:
        controller = Controller(options, client)
        if prepare is not None:
            prepare(controller)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, controller.stop, signal.Signals(signum).name)
        try:
            clean = await controller.run()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
    _log.info("stopped", clean=clean, failures=controller.supervisor.failures or None)
    return 0 if clean else 1
