"""A part of the demo run as a background process against a local plane: ``--dir DIR``, until SIGTERM.

The KubeVirt stand-in (``python -m cozygpu.devcluster.kubevirt``) and the
simulated nodes (``python -m cozygpu.devcluster.simnodes``) run this way; the
demo starts them (pid in ``DIR/<name>.pid``) and ``cozygpu cluster stop`` ends them.

The process acts as the plane's admin (``system:masters``) unless ``--user``
(and ``--group``, repeated) names another identity, minted from the plane's
client CA: the demo runs the KubeVirt stand-in as kubevirt-controller's
service account, the one caller the raw-GPU-name pod policy lets create a
pod that requests a GPU resource name (a launcher pod with a VMI owner).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import uvloop

from cozygpu.base.logging import configure, get_logger
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client

log = get_logger(__name__)

#: ``serve(admin client, the plane's directory, stop)``: runs until ``stop`` is set, then returns.
Serve = Callable[[Client, Path, asyncio.Event], Awaitable[None]]


def spawn(argv: Sequence[str], *, log: Path, pid_file: Path,
          env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own (a terminal's ^C does not reach it), its output appended to
    ``log`` and its pid written to ``pid_file``: how every background part of the local plane starts."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, start_new_session=True)
    pid_file.write_text(str(proc.pid))
    return proc


async def _run(serve: Serve, directory: Path, user: str | None = None, groups: Sequence[str] = ()) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    plane = ControlPlane.attach(directory)
    async with (plane.client() if user is None else plane.client(user, tuple(groups))) as client:
        await serve(client, directory, stop)
    log.info("stopped")


def main(prog: str, description: str, serve: Serve, argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--dir", type=Path, required=True, help="the local control plane's directory")
    parser.add_argument("--user", help="act as this user (a client certificate from the plane's CA), not the admin")
    parser.add_argument("--group", action="append", default=[], help="a group of --user (repeat for more)")
    args = parser.parse_args(argv)
    configure(fmt="text", level="INFO")
    uvloop.run(_run(serve, args.dir.resolve(), args.user, args.group))
    return 0
