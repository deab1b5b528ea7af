"""``cozygpu agent``: report this node's GPUs into its GPUNode (R-AGENT).

Every flag can also come from the environment as ``COZYGPU_<FLAG>``
(``--sysfs-root`` from ``COZYGPU_SYSFS_ROOT``); a flag on the command line
wins (``cozygpu.base.flags``, as for the controller). ``--node`` also falls
back to ``NODE_NAME``, which the DaemonSet sets from the downward API.

``--once`` reads, writes one report whatever was written before, prints the
status it wrote as JSON and exits: 0 for a complete report, 1 when kubelet or
sysfs could not be read (the last report was kept) or the write failed.
Without it the agent runs until SIGTERM or SIGINT. Bad flags exit 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Final

import attrs
import uvloop

from cozygpu.agent.kubelet import DEFAULT_SOCKET
from cozygpu.agent.pods import ApiPodLookup
from cozygpu.agent.report import GPUNodeWriter
from cozygpu.agent.runner import Agent
from cozygpu.base.flags import Flag, FlagError, FlagSet, choice, parse_bool, parse_positive_duration
from cozygpu.base.logging import configure, get_logger
from cozygpu.kube import Client
from cozygpu.kube import errors as kube_errors

LOG_FORMATS: Final = ("json", "text")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")

FLAGS: Final = FlagSet("cozygpu agent", "Report this node's GPUs into its GPUNode. Every flag can also come "
                       "from COZYGPU_<FLAG> (for example COZYGPU_SYSFS_ROOT=/host/sys).", [
    Flag("--node", "NAME", None, "this node's name (default: NODE_NAME)"),
    Flag("--sysfs-root", "DIR", "/sys", "where sysfs is mounted"),
    Flag("--podresources-socket", "PATH", DEFAULT_SOCKET, "kubelet's pod-resources unix socket"),
    Flag("--kubeconfig", "PATH", None, "kubeconfig file; in-cluster configuration when unset"),
    Flag("--interval", "DURATION", "15s", "how often to read sysfs and kubelet (a change is written at once)"),
    Flag("--report-interval", "DURATION", "2m", "the longest time between two reports when nothing changes"),
    Flag("--kubelet-timeout", "DURATION", "10s", "deadline of one read of the pod-resources API"),
    Flag("--once", None, "false", "read, write once, print the status written and exit"),
    Flag("--log-format", "json|text", "text", "log line format"),
    Flag("--log-level", "debug|info|warning|error", "info", "least severe level logged"),
])

_log = get_logger("cozygpu.agent")


@attrs.frozen(kw_only=True)
class Options:
    """The validated flags of one agent process."""

    node: str
    sysfs_root: str
    podresources_socket: str
    kubeconfig: str | None
    interval: float
    report_interval: float
    kubelet_timeout: float
    once: bool
    log_format: str
    log_level: str


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Options:
    """Validated options from ``argv`` and ``env`` (``os.environ`` when None); ``FlagError`` otherwise."""
    environ = os.environ if env is None else env
    values = FLAGS.read(argv, environ)
    node = values.raw("--node") or environ.get("NODE_NAME") or ""
    if not node:
        raise FlagError("--node", None, "required: set it, or COZYGPU_NODE or NODE_NAME")
    return Options(
        node=node,
        sysfs_root=values.required("--sysfs-root"),
        podresources_socket=values.required("--podresources-socket"),
        kubeconfig=values.raw("--kubeconfig") or None,
        interval=parse_positive_duration("--interval", values.required("--interval")),
        report_interval=parse_positive_duration("--report-interval", values.required("--report-interval")),
        kubelet_timeout=parse_positive_duration("--kubelet-timeout", values.required("--kubelet-timeout")),
        once=parse_bool("--once", values.required("--once")),
        log_format=choice("--log-format", values.required("--log-format"), LOG_FORMATS),
        log_level=choice("--log-level", values.required("--log-level"), LOG_LEVELS),
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = parse(list(sys.argv[1:] if argv is None else argv))
    except FlagError as err:
        print(f"cozygpu agent: {err}", file=sys.stderr)
        return 2
    except SystemExit as done:  # --help
        return int(done.code or 0)
    stop_logging = configure(fmt=options.log_format, level=options.log_level)
    try:
        return uvloop.run(_main(options))
    finally:
        stop_logging()


async def _client(kubeconfig: str | None) -> Client:
    try:
        return await Client.auto(kubeconfig, user_agent="cozygpu-agent")
    except Exception as err:  # kubernetes-asyncio raises its own ConfigException and OS errors
        raise SystemExit(f"cozygpu agent: no API access ({'kubeconfig ' + kubeconfig if kubeconfig else 'in-cluster'}):"
                         f" {err}") from err


async def _main(options: Options) -> int:
    async with await _client(options.kubeconfig) as client:
        agent = Agent(
            sysfs_root=options.sysfs_root,
            socket_path=options.podresources_socket,
            writer=GPUNodeWriter(client, options.node),
            pod_lookup=ApiPodLookup(client, options.node),
            interval=options.interval,
            report_interval=options.report_interval,
            kubelet_timeout=options.kubelet_timeout,
        )
        if options.once:
            return await _once(agent)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        _log.info("reporting", node=options.node, sysfs=options.sysfs_root, kubelet=options.podresources_socket)
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
