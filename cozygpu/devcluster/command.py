"""``cozygpu cluster start|stop|status``: a local control plane for people.

``start`` builds the pinned binaries when they are not cached yet (once per
machine), starts etcd and kube-apiserver on loopback in ``--dir``, installs
the chart's CRDs, writes ``DIR/kubeconfig`` for an admin and returns, leaving
both processes running. ``stop`` ends them and leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cozygpu.devcluster import apply, binaries, demo
from cozygpu.devcluster.plane import ControlPlane, ControlPlaneError

DEFAULT_DIR = Path(".cozygpu/cluster")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cozygpu cluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start", help="start etcd + kube-apiserver on loopback")
    start.add_argument("--kubernetes", default=binaries.DEFAULT_MINOR, choices=sorted(binaries.KUBERNETES),
                       help="Kubernetes minor (default %(default)s)")
    start.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory (default %(default)s)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    for name in ("stop", "status", "demo"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    return parser


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "start":
            return _start(args.kubernetes, args.dir.resolve(), args.timeout)
        plane = ControlPlane.attach(args.dir.resolve())
    except (ControlPlaneError, binaries.BuildError) as err:
        print(f"cozygpu cluster: {err}", file=sys.stderr)
        return 1
    if args.action == "demo":
        return demo.main(plane.directory)
    if args.action == "stop":
        demo.stop_controller(plane.directory)
        plane.stop()
        print(f"stopped the control plane in {plane.directory}")
        return 0
    state = "running" if plane.alive() else "not running (stale state; run stop)"
    print(f"Kubernetes {plane.kubernetes_version} at {plane.host}: {state}\nkubeconfig: {plane.kubeconfig}")
    return 0 if plane.alive() else 1


def _start(minor: str, directory: Path, timeout: float) -> int:
    bins = binaries.ensure(minor, with_kubectl=True)
    started = time.monotonic()
    plane = ControlPlane.start(minor=minor, directory=directory, timeout=timeout)
    ready = time.monotonic() - started
    try:
        asyncio.run(_install(plane))
    except BaseException:
        plane.stop()
        raise
    kubectl_dir = bins.kubectl.parent if bins.kubectl else None
    print(f"Kubernetes {plane.kubernetes_version} ready at {plane.host} in {ready:.1f} s "
          f"(CRDs installed after {time.monotonic() - started:.1f} s)")
    print(f"  export KUBECONFIG={plane.kubeconfig}")
    if kubectl_dir is not None and shutil.which("kubectl") != str(bins.kubectl):
        print(f"  export PATH={kubectl_dir}:$PATH   # kubectl {plane.kubernetes_version}")
    print("  kubectl get gpuclasses,gpudevices,gpunodes -A")
    print(f"  cozygpu cluster stop --dir {directory}")
    return 0


async def _install(plane: ControlPlane) -> None:
    async with plane.client() as admin:
        await apply.install_crds(admin)
