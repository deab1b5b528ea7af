"""The GPUs of a node added by hand (``cozygpu cluster nodes add --gpus``), as the real agent reads them.

No control plane: the node's board is laid out in a tmp sysfs tree, its device
plugins answer over a real kubelet pod-resources socket, and the agent's
report is what it would write into the GPUNode.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cozygpu.agent.inventory import PodKey, PodState, PodVerdict
from cozygpu.agent.runner import Agent
from cozygpu.devcluster import simnodes, sysfs_tree

H100 = "nvidia.com/GH100_H100_SXM5_80GB"


class Writer:
    async def write(self, status: dict[str, Any]) -> dict[str, Any]:
        return {"status": status}


async def no_pods(keys: Sequence[PodKey]) -> dict[PodKey, PodState]:
    return {key: PodState(PodVerdict.LIVE) for key in keys}


async def agent_report(tmp_path: Path, gpus: dict[str, int]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cozygpu-kubelet-") as sockets:
        tree, kubelet = simnodes.layout(tmp_path, Path(sockets), "added", simnodes.gpus_board(gpus))
        await kubelet.start()
        try:
            agent = Agent(sysfs_root=tree.root, socket_path=kubelet.socket_path, writer=Writer(), pod_lookup=no_pods)
            _, status = await agent.once()
        finally:
            await kubelet.stop()
    return status


def units(status: dict[str, Any]) -> Counter[str]:
    served: Counter[str] = Counter()
    for device in status["devices"]:
        served[device["resourceName"]] += device["allocatable"]
    return served


async def test_passthrough_vgpu_and_unknown_names_become_functions_the_agent_counts_as_those_units(
    tmp_path: Path,
) -> None:
    gpus = {H100: 3, "nvidia.com/GRID_T4-1Q": 4, "nvidia.com/GRID_T4-2Q": 2, "example.com/ACME_X1": 1}
    status = await agent_report(tmp_path, gpus)

    assert status["agent"]["problems"] == []
    assert units(status) == gpus
    assert status["resourceNames"] == sorted(gpus)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for device in status["devices"]:
        by_name.setdefault(device["resourceName"], []).append(device)
    # H100s: whole GPUs on vfio-pci, each alone in its IOMMU group, spread over both NUMA nodes.
    h100s = by_name[H100]
    assert [(d["kind"], d["driver"], d["vendorID"], d["deviceID"]) for d in h100s] == \
        [("Passthrough", "vfio-pci", "10de", "2330")] * 3
    assert len({d["iommuGroup"] for d in h100s}) == 3
    assert {d["numaNode"] for d in h100s} == {0, 1}
    # Both T4 profiles: mdev instances on one T4 on the vGPU host driver.
    t4 = by_name["nvidia.com/GRID_T4-1Q"] + by_name["nvidia.com/GRID_T4-2Q"]
    assert {(d["address"], d["kind"], d["driver"], d["deviceID"]) for d in t4} == \
        {(t4[0]["address"], "MdevParent", "nvidia", "1eb8")}
    assert sorted((t["name"], t["instances"]) for t in t4[0]["mdevTypes"]) == \
        [("GRID T4-1Q", 4), ("GRID T4-2Q", 2)]
    # A name no table knows: a generic passthrough GPU of its domain's vendor (NVIDIA for a domain not known).
    [unknown] = by_name["example.com/ACME_X1"]
    assert (unknown["kind"], unknown["driver"], unknown["vendorID"], unknown["deviceID"]) == \
        ("Passthrough", "vfio-pci", "10de", sysfs_tree.GENERIC_DEVICE)


async def test_a_vendor_domain_gives_its_vendor_id(tmp_path: Path) -> None:
    status = await agent_report(tmp_path, {"amd.com/MI300X": 2})
    assert units(status) == {"amd.com/MI300X": 2}
    assert {(d["vendorID"], d["kind"]) for d in status["devices"]} == {("1002", "Passthrough")}


@pytest.mark.parametrize(("gpus", "message"), [
    ({"gpu": 1}, "not a resource name of the form DOMAIN/NAME"),
    ({"nvidia.com/": 1}, "not a resource name of the form DOMAIN/NAME"),
    ({H100: sysfs_tree.MAX_PASSTHROUGH + 1}, f"at most {sysfs_tree.MAX_PASSTHROUGH} on one node"),
])
def test_a_board_no_node_can_have_is_refused_with_the_reason(gpus: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        simnodes.gpus_board(gpus)
