"""``cozygpu agent``: report this node's GPUs into its GPUNode (R-AGENT).

Every flag can also come from the environment as ``COZYGPU_<FLAG>``
(``--sysfs-root`` from ``COZYGPU_SYSFS_ROOT``); a flag on the command line
wins. ``--node`` also falls back to ``NODE_NAME``, which the DaemonSet sets
from the downward API.

``--once`` reads, writes one report whatever was written before, prints the
status it wrote as JSON and exits: 0 for a complete report, 1 when kubelet or
sysfs could not be read (the last report was kept) or the write failed.
Without it the agent runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Final

import uvloop

from cozygpu.agent.kubelet import DEFAULT_SOCKET
from cozygpu.agent.pods import ApiPodLookup
from cozygpu.agent.report import GPUNodeWriter
from cozygpu.agent.runner import Agent
from cozygpu.base.durations import parse_duration
from cozygpu.kube import Client
from cozygpu.kube import errors as kube_errors

ENV_PREFIX: Final = "COZYGPU_"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"", "0", "false", "no", "off"})

log = logging.getLogger("cozygpu.agent")


def duration(text: str) -> float:
    """A positive Go-style duration: ``15s``, ``2m``, ``500ms``, ``1m30s``."""
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use 15s, 2m, 1h)") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return seconds


def _env(flag: str) -> str | None:
    return os.environ.get(ENV_PREFIX + flag.upper().replace("-", "_"))


def _env_bool(flag: str) -> bool:
    value = (_env(flag) or "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{ENV_PREFIX}{flag.upper().replace('-', '_')}={value!r} is not a boolean")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cozygpu agent", description="Report this node's GPUs into its GPUNode.")
    p.add_argument("--node", default=_env("node") or os.environ.get("NODE_NAME") or "",
                   help="this node's name (env COZYGPU_NODE, else NODE_NAME)")
    p.add_argument("--sysfs-root", default=_env("sysfs-root") or "/sys", help="where sysfs is mounted")
    p.add_argument("--podresources-socket", default=_env("podresources-socket") or DEFAULT_SOCKET,
                   help="kubelet's pod-resources unix socket")
    p.add_argument("--kubeconfig", default=_env("kubeconfig") or None, help="kubeconfig file; else in-cluster")
    p.add_argument("--interval", type=duration, default=duration(_env("interval") or "15s"),
                   help="how often to read sysfs and kubelet (a change is written at once)")
    p.add_argument("--report-interval", type=duration, default=duration(_env("report-interval") or "2m"),
                   help="the longest time between two reports when nothing changes")
    p.add_argument("--kubelet-timeout", type=duration, default=duration(_env("kubelet-timeout") or "10s"),
                   help="deadline of one read of the pod-resources API")
    p.add_argument("--once", action="store_true", default=_env_bool("once"),
                   help="read, write once, print the status written and exit")
    p.add_argument("--log-level", default=_env("log-level") or "info",
                   choices=["debug", "info", "warning", "error"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except argparse.ArgumentTypeError as err:  # a bad default from the environment
        print(f"cozygpu agent: {err}", file=sys.stderr)
        return 2
    if not args.node:
        print("cozygpu agent: --node is required (or COZYGPU_NODE / NODE_NAME)", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return uvloop.run(_main(args))


async def _client(kubeconfig: str | None) -> Client:
    try:
        return await Client.auto(kubeconfig, user_agent="cozygpu-agent")
    except Exception as err:  # kubernetes-asyncio raises its own ConfigException and OS errors
        raise SystemExit(f"cozygpu agent: no API access ({'kubeconfig ' + kubeconfig if kubeconfig else 'in-cluster'}):"
                         f" {err}") from err


async def _main(args: argparse.Namespace) -> int:
    async with await _client(args.kubeconfig) as client:
        agent = Agent(
            sysfs_root=args.sysfs_root,
            socket_path=args.podresources_socket,
            writer=GPUNodeWriter(client, args.node),
            pod_lookup=ApiPodLookup(client, args.node),
            interval=args.interval,
            report_interval=args.report_interval,
            kubelet_timeout=args.kubelet_timeout,
        )
        if args.once:
            return await _once(agent)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        log.info("reporting node %s (sysfs %s, kubelet %s)", args.node, args.sysfs_root, args.podresources_socket)
        await agent.run(stop)
        return 0


async def _once(agent: Agent) -> int:
    try:
        observation, status = await agent.once()
    except kube_errors.KubeError as err:
        print(f"cozygpu agent: writing the GPUNode failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2, sort_keys=True))
    return 0 if observation.complete else 1
