"""A part of the demo run as a background process against a local plane: ``--dir DIR``, until SIGTERM.

The KubeVirt stand-in (``python -m cozygpu.devcluster.kubevirt``) and the
simulated nodes (``python -m cozygpu.devcluster.simnodes``) run this way; the
demo starts them (pid in ``DIR/<name>.pid``) and ``cozygpu cluster stop`` ends them.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from cozygpu.base.logging import configure, get_logger
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client

log = get_logger(__name__)

#: ``serve(admin client, the plane's directory, stop)``: runs until ``stop`` is set, then returns.
Serve = Callable[[Client, Path, asyncio.Event], Awaitable[None]]


async def _run(serve: Serve, directory: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with ControlPlane.attach(directory).client() as client:
        await serve(client, directory, stop)
    log.info("stopped")


def main(prog: str, description: str, serve: Serve, argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--dir", type=Path, required=True, help="the local control plane's directory")
    args = parser.parse_args(argv)
    configure(fmt="text", level="INFO")
    asyncio.run(_run(serve, args.dir.resolve()))
    return 0
