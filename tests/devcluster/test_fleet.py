"""A fleet of 1,000 simulated GPU nodes — the benchmarks' fleet — is created in
bulk and kwok holds it Ready; the figures (creation time, idle CPU and memory of
kwok, the API server and etcd) are printed, never asserted (run with ``-s``)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

from cozygpu.devcluster import nodes
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client

FLEET = 1000
IDLE_SECONDS = 15.0
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def test_a_fleet_of_a_thousand_gpu_nodes_is_created_in_bulk_and_held_ready(
    full_plane: ControlPlane, full_admin: Client
) -> None:
    tag = uuid.uuid4().hex[:6]
    fleet = [nodes.SimNode(f"fleet-{tag}-{i:04d}", {"nvidia.com/GH100_H100_SXM5_80GB": 8})
             for i in range(FLEET)]
    names = [n.name for n in fleet]
    started = time.monotonic()
    await nodes.add_nodes(full_admin, fleet)
    created = time.monotonic() - started
    try:
        await nodes.wait_ready(full_admin, names, timeout=180)
        ready = time.monotonic() - started
        watched = {"kwok": full_plane.components["kwok"][0], "kube-apiserver": full_plane.apiserver_pid,
                   "etcd": full_plane.etcd_pid}
        before = {name: cpu_seconds(pid) for name, pid in watched.items()}
        await asyncio.sleep(IDLE_SECONDS)  # the idle period being measured, not a wait for an event
        usage = {name: (cpu_seconds(pid) - before[name]) / IDLE_SECONDS for name, pid in watched.items()}

        listed = await full_admin.list_objects(nodes.NODES, params={"labelSelector": "type=kwok"})
        mine = [n for n in listed["items"] if n["metadata"]["name"] in set(names)]
        not_ready = [n["metadata"]["name"] for n in mine if not nodes.is_ready(n) or nodes.schedulable_taints(n)]
        assert len(mine) == FLEET
        assert not_ready == [], f"{len(not_ready)} fleet nodes fell out of Ready while idle: {not_ready[:5]}"
        print(f"\n{FLEET} simulated GPU nodes: created in {created:.1f} s, all Ready after {ready:.1f} s")
        for name, pid in watched.items():
            print(f"  {name:<15} idle CPU {usage[name] * 100:5.1f}% of one core   RSS {rss_mb(pid):6.0f} MB")
    finally:
        await nodes.remove_nodes(full_admin, names)
