"""Simulated GPU nodes that keep reporting: kwok Nodes, their sysfs trees and kubelets, and the real agent on each.

``python -m cozygpu.devcluster.simnodes --dir DIR`` (the demo runs it in the
background, pid in ``DIR/simnodes.pid``; ``cozygpu cluster stop`` ends it):

- lays out each node's sysfs tree under ``DIR/nodes/<name>/`` and serves its
  kubelet pod-resources socket (in a short temporary directory: a unix socket
  path has a length limit) — the two boundaries that cannot run on this machine;
- creates the kwok-managed Node (Ready, its allocatable what the simulated
  device plugins report; an existing Node of that name is kept);
- runs the **real agent** loop for each node until SIGTERM, so the GPUNode
  reports stay fresh (the binder serves nothing new from a report older than
  its staleness limit) for as long as the demo's cluster runs.

The demo's boards: an HGX board with two H100s on vfio-pci (``hgx``) and a T4
on the vGPU host driver with five mdev instances of two profiles (``t4``).

``python -m cozygpu.devcluster.simnodes --dir DIR --node NAME --gpus RESOURCE=COUNT ...``
is one node added by hand: ``cozygpu cluster nodes add NAME --gpus ...``
creates its Node (with its labels and taints) and starts this process for it
(``start_added``: pid in ``DIR/nodes/NAME.pid``, log in
``DIR/logs/node-NAME.log``), whose board ``sysfs_tree.board_for`` makes from
the resource names; ``cozygpu cluster nodes remove`` and ``cozygpu cluster
stop`` end it (``stop_added``), which removes its socket, and then its sysfs
tree. Every such process also ends by itself when the plane's API server exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from cozygpu.agent.pods import ApiPodLookup
from cozygpu.agent.report import GPUNodeWriter
from cozygpu.agent.runner import Agent
from cozygpu.base.logging import get_logger
from cozygpu.devcluster import background, nodes, sysfs_tree
from cozygpu.devcluster.fake_kubelet import Device, FakeKubelet
from cozygpu.devcluster.plane import ControlPlane, ControlPlaneError, alive, terminate
from cozygpu.kube import Client

log = get_logger(__name__)

#: (node, board) of the demo: two HGX boards (a hold can move between them) and a T4 with vGPUs.
DEMO_NODES: Final = (("gpu-1", "hgx"), ("gpu-2", "t4"), ("gpu-3", "hgx"))
#: How often an agent rewrites an unchanged report (well inside the binder's five-minute staleness limit).
REPORT_INTERVAL: Final = 60.0


#: A board lays out a node's GPU functions in its sysfs tree and says what its device plugins advertise.
Board = Callable[[sysfs_tree.SysfsTree], list[Device]]


def hgx_board(tree: sysfs_tree.SysfsTree) -> list[Device]:
    hgx = sysfs_tree.hgx_passthrough(tree)
    # KubeVirt's PCI device plugin hands out vfio functions by IOMMU group.
    return [Device(hgx.resource, str(group), (numa,)) for group, numa in zip(hgx.groups, (0, 1), strict=True)]


def t4_board(tree: sysfs_tree.SysfsTree) -> list[Device]:
    t4 = sysfs_tree.mdev_parent(tree)
    return [Device(t4.small_resource, uuid, (0,)) for uuid in t4.small] + \
        [Device(t4.big_resource, uuid, (0,)) for uuid in t4.big]


BOARDS: Final[Mapping[str, Board]] = {"hgx": hgx_board, "t4": t4_board}


def gpus_board(gpus: Mapping[str, int]) -> Board:
    """The board of a node added by hand with these units (``sysfs_tree.board_for``; ValueError when none can)."""
    board = sysfs_tree.board_for(gpus)

    def lay_out(tree: sysfs_tree.SysfsTree) -> list[Device]:
        board.lay_out(tree)
        return [Device(resource, device_id, (numa,)) for resource, device_id, numa in board.plugin_devices()]

    return lay_out


def layout(directory: Path, sockets: Path, name: str, board: str | Board) -> tuple[sysfs_tree.SysfsTree, FakeKubelet]:
    """A fresh sysfs tree under ``directory/name`` and an (unstarted) kubelet on ``sockets/name.sock``.

    ``board`` is one of the demo's (``hgx``, ``t4``) or a :data:`Board`.
    The sockets live apart, in a short directory: a unix socket path has a length limit.
    """
    if isinstance(board, str):
        if board not in BOARDS:
            raise ValueError(f"unknown board {board!r}: {' or '.join(BOARDS)}")
        board = BOARDS[board]
    home = directory / name
    shutil.rmtree(home, ignore_errors=True)
    tree = sysfs_tree.SysfsTree(home / "sys")
    kubelet = FakeKubelet(str(sockets / f"{name}.sock"))
    kubelet.allocatable = board(tree)
    return tree, kubelet


def gpus(kubelet: FakeKubelet) -> dict[str, int]:
    counts: dict[str, int] = {}
    for device in kubelet.allocatable:
        counts[device.resource] = counts.get(device.resource, 0) + 1
    return counts


async def ensure_node(admin: Client, node: nodes.SimNode) -> None:
    """Create the Node, or take the existing one back to the demo's shape (schedulable, no taints).

    An existing Node is kept, not replaced: a new Node would have a new UID, and the garbage collector
    would then delete the GPUNode the agent just reported on (it is owned by the old Node).
    """
    path = f"{nodes.NODES}/{node.name}"
    if await admin.get_or_none(path) is None:
        await admin.create(nodes.NODES, node.body())
    else:
        await admin.merge_patch(path, {"spec": {"unschedulable": None, "taints": node.body()["spec"].get("taints")}})


async def serve(admin: Client, directory: Path, boards: Sequence[tuple[str, str | Board]], stop: asyncio.Event,
                *, create_nodes: bool = True) -> None:
    """Lay out every node (and, with ``create_nodes``, create its Node and wait until it is Ready),
    then run the agents until ``stop``."""
    with tempfile.TemporaryDirectory(prefix="cozygpu-kubelets-") as sockets:
        laid = [(name, *layout(directory, Path(sockets), name, board)) for name, board in boards]
        await _serve(admin, laid, stop, create_nodes=create_nodes)


async def _serve(admin: Client, laid: Sequence[tuple[str, sysfs_tree.SysfsTree, FakeKubelet]],
                 stop: asyncio.Event, *, create_nodes: bool) -> None:
    if create_nodes:
        for name, _, kubelet in laid:
            await ensure_node(admin, nodes.SimNode(name, gpus(kubelet)))
        await nodes.wait_ready(admin, [name for name, _, _ in laid])
    kubelets = [await kubelet.start() for _, _, kubelet in laid]
    try:
        async with asyncio.TaskGroup() as tasks:
            for name, tree, kubelet in laid:
                agent = Agent(sysfs_root=tree.root, socket_path=kubelet.socket_path,
                              writer=GPUNodeWriter(admin, name), pod_lookup=ApiPodLookup(admin, name),
                              kubelet_timeout=5.0, report_interval=REPORT_INTERVAL)
                tasks.create_task(agent.run(stop), name=f"agent {name}")
            log.info("agents running", nodes=[name for name, _, _ in laid])
    finally:
        for kubelet in kubelets:
            await kubelet.stop()


@contextlib.asynccontextmanager
async def _stops_with_plane(directory: Path, stop: asyncio.Event) -> AsyncIterator[None]:
    """Set ``stop`` when the plane's API server exits, so a plane ended some other way leaves no agent behind."""
    try:
        watched = os.pidfd_open(ControlPlane.attach(directory).apiserver_pid)
    except (ControlPlaneError, ProcessLookupError) as err:
        log.warning("no running API server to follow: stopping", directory=str(directory), problem=str(err))
        stop.set()
        yield
        return
    loop = asyncio.get_running_loop()
    loop.add_reader(watched, stop.set)  # a pidfd turns readable when its process exits
    try:
        yield
    finally:
        loop.remove_reader(watched)
        os.close(watched)


async def _serve_demo(admin: Client, directory: Path, stop: asyncio.Event) -> None:
    async with _stops_with_plane(directory, stop):
        await serve(admin, directory / "nodes", DEMO_NODES, stop)


async def _serve_added(name: str, gpu_units: Mapping[str, int], admin: Client, directory: Path,
                       stop: asyncio.Event) -> None:
    async with _stops_with_plane(directory, stop):
        await serve(admin, directory / "nodes", [(name, gpus_board(gpu_units))], stop, create_nodes=False)


# -- nodes added by hand: one background process each ---------------------------------------

#: What every added node's process has in its command line (``alive``/``terminate`` check it before a signal).
PROGRAM: Final = "cozygpu.devcluster.simnodes"


def _pid_file(directory: Path, name: str) -> Path:
    return directory / "nodes" / f"{name}.pid"


def log_file(directory: Path, name: str) -> Path:
    return directory / "logs" / f"node-{name}.log"


def _pid(directory: Path, name: str) -> int | None:
    try:
        return int(_pid_file(directory, name).read_text())
    except (FileNotFoundError, ValueError):
        return None


def demo_nodes_running(directory: Path, names: Iterable[str]) -> list[str]:
    """Those of ``names`` that the demo's simulated nodes process serves now."""
    demo_pid = directory / "simnodes.pid"
    if not demo_pid.exists() or not alive(int(demo_pid.read_text()), expect=PROGRAM):
        return []
    demo_names = {name for name, _ in DEMO_NODES}
    return [name for name in names if name in demo_names]


def start_added(directory: Path, name: str, gpu_units: Mapping[str, int]) -> int:
    """Start the process of one node added by hand (its Node exists); returns its pid (also in its pid file)."""
    argv = [sys.executable, "-m", PROGRAM, "--dir", str(directory), "--node", name]
    argv += [f"--gpus={resource}={count}" for resource, count in gpu_units.items()]
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    (directory / "nodes").mkdir(exist_ok=True)
    return background.spawn(argv, log=log_file(directory, name), pid_file=_pid_file(directory, name), env=env).pid


def stop_added(directory: Path, names: Iterable[str] | None = None, *, timeout: float = 30.0) -> list[str]:
    """End the processes of these added nodes (every one: ``None``) and remove their sysfs trees.

    SIGTERM lets the process stop its kubelet (which removes the socket) and its agent; the names whose
    process ran are returned.
    """
    if names is None:
        names = sorted(path.stem for path in (directory / "nodes").glob("*.pid"))
    ended = []
    for name in names:
        pid = _pid(directory, name)
        if pid is None:
            continue
        if alive(pid, expect=PROGRAM):
            ended.append(name)
        terminate(pid, timeout, expect=PROGRAM)
        _pid_file(directory, name).unlink(missing_ok=True)
        shutil.rmtree(directory / "nodes" / name, ignore_errors=True)
    return ended


def added_health(directory: Path) -> list[tuple[str, int, str]]:
    """(``node NAME``, pid, "ok" | "exited") of each added node's process, for ``cozygpu cluster status``."""
    rows = []
    for pid_file in sorted((directory / "nodes").glob("*.pid")):
        pid = _pid(directory, pid_file.stem)
        if pid is not None:
            rows.append((f"node {pid_file.stem}", pid, "ok" if alive(pid, expect=PROGRAM) else "exited"))
    return rows


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {log})"


async def wait_reports(admin: Client, directory: Path, names: Sequence[str], since: datetime.datetime, *,
                       timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    """The GPUNode status of each added node once its agent has reported at or after ``since`` (whole seconds).

    Fails at once, with the end of its log, when a node's process has exited.
    """
    since = since.replace(microsecond=0)
    reported: dict[str, dict[str, Any]] = {}
    try:
        async with asyncio.timeout(timeout):
            while True:
                for name in names:
                    if name in reported:
                        continue
                    pid = _pid(directory, name)
                    if pid is None or not alive(pid, expect=PROGRAM):
                        log = log_file(directory, name)
                        raise ControlPlaneError(f"the process of simulated node {name} exited; the end of {log}:\n"
                                                f"{_tail(log)}")
                    found = await admin.get_or_none(f"{nodes.GPUNODES}/{name}")
                    status = (found or {}).get("status") or {}
                    stamp = (status.get("agent") or {}).get("lastReport") or ""
                    if stamp and datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")) >= since:
                        reported[name] = status
                if len(reported) == len(names):
                    return reported
                await asyncio.sleep(0.2)  # another process writes them; polled, as `cozygpu cluster demo` does
    except TimeoutError:
        logs = ", ".join(str(log_file(directory, name)) for name in names if name not in reported)
        raise TimeoutError(f"no GPUNode report within {timeout:.0f} s; see {logs}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--node")
    parser.add_argument("--gpus", action="append", default=[])
    added, rest = parser.parse_known_args(argv)
    if added.node is None:
        return background.main(f"python -m {PROGRAM}",
                               "the demo's simulated GPU nodes and their agents, until SIGTERM", _serve_demo, rest)
    serve_added = functools.partial(_serve_added, added.node, nodes.parse_gpus(added.gpus))
    return background.main(f"python -m {PROGRAM} --node {added.node} --gpus RESOURCE=COUNT ...",
                           f"the simulated GPU node {added.node} added by hand and its agent, until SIGTERM",
                           serve_added, rest)


if __name__ == "__main__":
    raise SystemExit(main())
