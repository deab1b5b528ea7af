"""``cozygpu cluster start|stop|status|nodes|demo``: a local control plane for people.

``start`` builds the pinned binaries when they are not cached yet (once per
machine), starts the whole plane on loopback in ``--dir`` (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and kwok; with
``--api-only`` just the first two), installs the chart's CRDs, writes
``DIR/kubeconfig`` for an admin and returns, leaving the processes running;
``--prometheus`` adds a Prometheus with the chart's rules that scrapes the
controller replicas the demo starts (``cozygpu.devcluster.prometheus``).
``status`` lists each process with its pid and health; ``stop`` ends them all
and leaves no process behind. ``nodes add|remove`` manages simulated GPU
nodes (kwok keeps them Ready); a node added with ``--gpus`` gets a sysfs tree,
a kubelet pod-resources socket and the real agent in a background process of
its own (``simnodes``), so its GPUNode report comes within seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cozygpu.devcluster import apply, binaries, chart, demo, nodes, simnodes
from cozygpu.devcluster import plane as plane_module
from cozygpu.devcluster import prometheus as prometheus_module
from cozygpu.devcluster.plane import ControlPlane, ControlPlaneError
from cozygpu.kube import errors

DEFAULT_DIR = Path(".cozygpu/cluster")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cozygpu cluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start", help="start etcd + kube-apiserver on loopback")
    start.add_argument("--kubernetes", default=binaries.DEFAULT_MINOR, choices=sorted(binaries.KUBERNETES),
                       help="Kubernetes minor (default %(default)s)")
    start.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory (default %(default)s)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    start.add_argument("--node-lease-seconds", type=int, default=plane_module.NODE_LEASE_SECONDS,
                       help="simulated nodes' Lease duration, also the NotReady grace (default %(default)s)")
    start.add_argument("--api-only", action="store_true",
                       help="only etcd + kube-apiserver (no scheduler, controller-manager or kwok)")
    start.add_argument("--prometheus", action="store_true",
                       help="also run Prometheus on loopback with the chart's alert and recording rules, scraping "
                            "the controller replicas every 5 s")
    for name in ("stop", "status", "demo"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    node_cmd = sub.add_parser("nodes", help="add or remove simulated GPU nodes (kwok keeps them Ready; "
                                            "the real agent reports their GPUs)")
    node_sub = node_cmd.add_subparsers(dest="nodes_action", required=True)
    add = node_sub.add_parser("add", help="create simulated nodes")
    add.add_argument("names", nargs="+", metavar="NAME")
    add.add_argument("--gpus", action="append", default=[], metavar="RESOURCE=COUNT",
                     help="GPU units per node, e.g. nvidia.com/GH100_H100_SXM5_80GB=8 (repeatable): a vGPU "
                          "profile name (nvidia.com/GRID_T4-1Q) gets mdev instances, any other name vfio "
                          "passthrough GPUs")
    add.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    add.add_argument("--taint", action="append", default=[], metavar="KEY[=VALUE]:EFFECT")
    add.add_argument("--no-wait", action="store_true",
                     help="return without waiting for the nodes to be Ready and their agents to report")
    remove = node_sub.add_parser("remove", help="delete simulated nodes, their GPUNodes and their agents")
    remove.add_argument("names", nargs="+", metavar="NAME")
    for p in (add, remove):
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "start":
            return _start(args.kubernetes, args.dir.resolve(), args.timeout, full=not args.api_only,
                          node_lease_seconds=args.node_lease_seconds, prometheus=args.prometheus)
        plane = ControlPlane.attach(args.dir.resolve())
        if args.action == "nodes":
            return asyncio.run(_nodes(plane, args))
    except (ControlPlaneError, binaries.BuildError, chart.ChartError, nodes.NodeSpecError, errors.KubeError,
            TimeoutError) as err:
        print(f"cozygpu cluster: {err or type(err).__name__}", file=sys.stderr)
        return 1
    if args.action == "demo":
        return demo.main(plane.directory)
    if args.action == "stop":
        demo.stop_background(plane.directory)
        simnodes.stop_added(plane.directory)
        prometheus_module.stop(plane.directory)
        plane.stop()
        print(f"stopped the control plane in {plane.directory}")
        return 0
    return _status(plane)


def _status(plane: ControlPlane) -> int:
    plane_rows = plane.health()
    # The demo's processes and Prometheus are listed too; only the plane's decide the exit code (hack/up.sh reuses
    # a live plane).
    rows = (plane_rows + prometheus_module.health(plane.directory) + demo.background_health(plane.directory)
            + simnodes.added_health(plane.directory))
    print(f"Kubernetes {plane.kubernetes_version} at {plane.host} ({'full' if plane.full else 'API only'})\n"
          f"kubeconfig: {plane.kubeconfig}")
    width = max(len(name) for name, _, _ in rows)
    print(f"{'PROCESS'.ljust(width)}   PID       STATE")
    for name, pid, state in rows:
        print(f"{name.ljust(width)}   {pid:<8}  {state}")
    dead = plane.dead()
    for name, tail in dead.items():
        print(f"\n{name} is not running; the end of {plane.directory / 'logs' / (name + '.log')}:\n{tail}")
    return 0 if all(state == "ok" for _, _, state in plane_rows) else 1


async def _nodes(plane: ControlPlane, args: argparse.Namespace) -> int:
    names: list[str] = args.names
    if busy := simnodes.demo_nodes_running(plane.directory, names):
        raise nodes.NodeSpecError(f"{', '.join(busy)}: the demo's simulated nodes run them (`cozygpu cluster stop` "
                                  "ends the demo); pick other names")
    async with plane.client() as admin:
        if args.nodes_action == "remove":
            simnodes.stop_added(plane.directory, names)
            await nodes.remove_nodes(admin, names)
            print(f"removed {', '.join(names)}")
            return 0
        gpus, labels = nodes.parse_gpus(args.gpus), nodes.parse_labels(args.label)
        taints = [nodes.parse_taint(t) for t in args.taint]
        if gpus:
            try:
                simnodes.gpus_board(gpus)
            except ValueError as err:
                raise nodes.NodeSpecError(f"--gpus: {err}") from None
        # A node added again is replaced whole: its process, Node and GPUNode.
        simnodes.stop_added(plane.directory, names)
        await nodes.remove_nodes(admin, names)
        since = datetime.datetime.now(datetime.UTC)
        await nodes.add_nodes(admin, [nodes.SimNode(name, gpus, labels, taints) for name in names])
        pids = {name: simnodes.start_added(plane.directory, name, gpus) for name in names} if gpus else {}
        if args.no_wait:
            print(f"added {', '.join(names)}")
        elif not plane.full:
            print(f"added {', '.join(names)} (API-only plane: no kwok keeps them Ready)")
        else:
            waited = await nodes.wait_ready(admin, names)
            print(f"added {', '.join(names)}, Ready after {waited:.1f} s")
        if pids and not args.no_wait:
            reports = await simnodes.wait_reports(admin, plane.directory, names, since)
            for name in names:
                status = reports[name]
                print(f"  {name}: {status['deviceCount']} GPU functions, {status['allocatable']} allocatable "
                      f"({', '.join(status['resourceNames'])}), reported by the agent in pid {pids[name]}, "
                      f"log {simnodes.log_file(plane.directory, name)}")
    return 0


def _start(minor: str, directory: Path, timeout: float, *, full: bool, node_lease_seconds: int,
           prometheus: bool) -> int:
    if node_lease_seconds < 4:
        raise ControlPlaneError(f"--node-lease-seconds {node_lease_seconds}: at least 4 (kwok renews every quarter)")
    bins = binaries.ensure(minor, with_kubectl=True, full=full)
    prometheus_bins = binaries.ensure_prometheus() if prometheus else None
    started = time.monotonic()
    plane = ControlPlane.start(minor=minor, directory=directory, timeout=timeout, full=full,
                               node_lease_seconds=node_lease_seconds)
    ready = time.monotonic() - started
    running: prometheus_module.Prometheus | None = None
    groups: list[dict[str, Any]] = []
    try:
        asyncio.run(_install(plane))
        if prometheus_bins is not None:
            groups = prometheus_module.render_rules(kube_version=minor)
            scrape = asyncio.run(_replicas_scrape(plane))
            running = prometheus_module.start(directory, groups, scrape=scrape, bins=prometheus_bins, timeout=timeout)
    except BaseException:
        prometheus_module.stop(directory)
        plane.stop()
        raise
    kubectl_dir = bins.kubectl.parent if bins.kubectl else None
    what = "etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok" if full else \
        "etcd and kube-apiserver"
    print(f"Kubernetes {plane.kubernetes_version} ready at {plane.host} in {ready:.1f} s ({what}; "
          f"CRDs installed after {time.monotonic() - started:.1f} s)")
    print(f"  export KUBECONFIG={plane.kubeconfig}")
    if kubectl_dir is not None and shutil.which("kubectl") != str(bins.kubectl):
        print(f"  export PATH={kubectl_dir}:$PATH   # kubectl {plane.kubernetes_version}")
    print("  kubectl get gpuclasses,gpudevices,gpunodes -A")
    print(f"  cozygpu cluster stop --dir {directory}")
    if running is not None:
        _print_prometheus(running, groups)
    return 0


def _print_prometheus(running: prometheus_module.Prometheus, groups: list[dict[str, Any]]) -> None:
    rules = sum(len(group["rules"]) for group in groups)
    print(f"Prometheus {binaries.PROMETHEUS_RELEASE} at {running.url} (pid {running.pid}, log "
          f"{running.directory / 'logs' / 'prometheus.log'}): the chart's {rules} rules; it scrapes the controller "
          f"replicas' /metrics every {prometheus_module.SCRAPE_INTERVAL} once the demo starts them. Worth running:")
    for what, query in prometheus_module.QUERIES:
        print(f"  # {what}")
        print(f"  curl -s {running.url}/api/v1/query --data-urlencode 'query={query}'")
    print(f"  curl -s {running.url}/api/v1/targets   # the replicas, up or not\n"
          f"  curl -s {running.url}/api/v1/alerts    # the chart's alerts, pending or firing")


async def _replicas_scrape(plane: ControlPlane) -> prometheus_module.Scrape:
    async with plane.client() as admin:
        return await prometheus_module.replicas_scrape(admin, plane)


async def _install(plane: ControlPlane) -> None:
    async with plane.client() as admin:
        await apply.install_crds(admin)
