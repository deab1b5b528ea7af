"""Simulated GPU nodes that keep reporting: kwok Nodes, their sysfs trees and kubelets, and the real agent on each.

``python -m cozygpu.devcluster.simnodes --dir DIR`` (the demo runs it in the
background, pid in ``DIR/simnodes.pid``; ``cozygpu cluster stop`` ends it):

- lays out each node's sysfs tree and serves its kubelet pod-resources
  socket under ``DIR/nodes/<name>/`` (the two boundaries that cannot run on
  this machine);
- creates the kwok-managed Node (Ready, its allocatable what the simulated
  device plugins report; an existing Node of that name is replaced);
- runs the **real agent** loop for each node until SIGTERM, so the GPUNode
  reports stay fresh (the binder serves nothing new from a report older than
  its staleness limit) for as long as the demo's cluster runs.

The boards: an HGX board with two H100s on vfio-pci (``hgx``) and a T4 on the
vGPU host driver with five mdev instances of two profiles (``t4``).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from cozygpu.agent.pods import ApiPodLookup
from cozygpu.agent.report import GPUNodeWriter
from cozygpu.agent.runner import Agent
from cozygpu.base.logging import get_logger
from cozygpu.devcluster import background, nodes, sysfs_tree
from cozygpu.devcluster.fake_kubelet import Device, FakeKubelet
from cozygpu.kube import Client

log = get_logger(__name__)

#: (node, board) of the demo: two HGX boards (a hold can move between them) and a T4 with vGPUs.
DEMO_NODES: Final = (("gpu-1", "hgx"), ("gpu-2", "t4"), ("gpu-3", "hgx"))
#: How often an agent rewrites an unchanged report (well inside the binder's five-minute staleness limit).
REPORT_INTERVAL: Final = 60.0


def layout(directory: Path, sockets: Path, name: str, board: str) -> tuple[sysfs_tree.SysfsTree, FakeKubelet]:
    """A fresh sysfs tree under ``directory/name`` and an (unstarted) kubelet on ``sockets/name.sock``.

    The sockets live apart, in a short directory: a unix socket path has a length limit.
    """
    home = directory / name
    shutil.rmtree(home, ignore_errors=True)
    tree = sysfs_tree.SysfsTree(home / "sys")
    kubelet = FakeKubelet(str(sockets / f"{name}.sock"))
    if board == "hgx":
        hgx = sysfs_tree.hgx_passthrough(tree)
        # KubeVirt's PCI device plugin hands out vfio functions by IOMMU group.
        groups = zip(hgx.groups, (0, 1), strict=True)
        kubelet.allocatable = [Device(hgx.resource, str(group), (numa,)) for group, numa in groups]
    elif board == "t4":
        t4 = sysfs_tree.mdev_parent(tree)
        kubelet.allocatable = [Device(t4.small_resource, uuid, (0,)) for uuid in t4.small]
        kubelet.allocatable += [Device(t4.big_resource, uuid, (0,)) for uuid in t4.big]
    else:
        raise ValueError(f"unknown board {board!r}: hgx or t4")
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


async def serve(admin: Client, directory: Path, boards: Sequence[tuple[str, str]], stop: asyncio.Event) -> None:
    """Lay out and create every node, then run the agents until ``stop``."""
    with tempfile.TemporaryDirectory(prefix="cozygpu-kubelets-") as sockets:
        await _serve(admin, [(name, *layout(directory, Path(sockets), name, board)) for name, board in boards], stop)


async def _serve(admin: Client, laid: Sequence[tuple[str, sysfs_tree.SysfsTree, FakeKubelet]],
                 stop: asyncio.Event) -> None:
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


async def _serve_demo(admin: Client, directory: Path, stop: asyncio.Event) -> None:
    await serve(admin, directory / "nodes", DEMO_NODES, stop)


def main(argv: Sequence[str] | None = None) -> int:
    return background.main("python -m cozygpu.devcluster.simnodes",
                           "the demo's simulated GPU nodes and their agents, until SIGTERM", _serve_demo, argv)


if __name__ == "__main__":
    raise SystemExit(main())
