"""The agent's loop: sysfs tree + kubelet over gRPC in, status writes out (the API side is faked here)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from cozygpu.agent.inventory import PodKey, PodState, PodVerdict
from cozygpu.agent.runner import MAX_PROBLEMS, Agent, cap_problems
from cozygpu.base.clock import FakeClock
from cozygpu.devcluster import sysfs_tree as layouts
from cozygpu.devcluster.fake_kubelet import Device, FakeKubelet, Pod
from cozygpu.devcluster.sysfs_tree import SysfsTree
from cozygpu.kube import errors as kube_errors

T0 = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)


class RecordingWriter:
    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.fail: kube_errors.KubeError | None = None
        self.wrote = asyncio.Event()

    async def write(self, status: dict[str, Any]) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.written.append(status)
        self.wrote.set()
        return {"status": status}


class Pods:
    """Pod lookups answered from a table; records what was asked."""

    def __init__(self, states: dict[PodKey, PodState] | None = None) -> None:
        self.states = states or {}
        self.asked: list[list[PodKey]] = []

    async def __call__(self, keys: Sequence[PodKey]) -> dict[PodKey, PodState]:
        self.asked.append(list(keys))
        return {key: self.states.get(key, PodState(PodVerdict.LIVE)) for key in keys}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1000.0, wall_start=T0)


@pytest.fixture
def writer() -> RecordingWriter:
    return RecordingWriter()


@pytest.fixture
def make_agent(
    tree: SysfsTree, socket_path: str, writer: RecordingWriter, clock: FakeClock,
) -> Callable[..., Agent]:
    def make(pods: Pods | None = None, **kw: Any) -> Agent:
        return Agent(sysfs_root=tree.root, socket_path=socket_path, writer=writer, pod_lookup=pods or Pods(),
                     interval=15.0, report_interval=120.0, kubelet_timeout=2.0, version="9.9.9",
                     clock=clock, **kw)
    return make


async def test_a_cycle_writes_devices_resource_names_and_the_agent_fields(
    tree: SysfsTree, kubelet: FakeKubelet, writer: RecordingWriter, make_agent: Callable[..., Agent],
) -> None:
    hgx = layouts.hgx_passthrough(tree)
    kubelet.allocatable = [Device(hgx.resource, "30", (0,)), Device(hgx.resource, "120", (1,))]

    delay = await make_agent().cycle()

    assert delay == 15.0
    (status,) = writer.written
    assert status["agent"] == {"version": "9.9.9", "lastReport": "2026-12-02T09:30:00Z", "problems": []}
    assert status["resourceNames"] == [hgx.resource]
    assert [(d["address"], d["allocatable"]) for d in status["devices"]] == [(hgx.gpus[0], 1), (hgx.gpus[1], 1)]
    assert "conditions" not in status


async def test_a_completed_pod_still_listed_is_looked_up_and_skipped(
    tree: SysfsTree, kubelet: FakeKubelet, writer: RecordingWriter, make_agent: Callable[..., Agent],
) -> None:
    hgx = layouts.hgx_passthrough(tree)
    kubelet.allocatable = [Device(hgx.resource, "30"), Device(hgx.resource, "120")]
    kubelet.pods = [
        Pod("tenant-a", "virt-launcher-done", [("compute", [Device(hgx.resource, "30")])]),
        Pod("tenant-a", "virt-launcher-up", [("compute", [Device(hgx.resource, "120")])]),
        Pod("kube-system", "no-gpus", [("c", [Device("devices.kubevirt.io/kvm", "kvm1")])]),
    ]
    pods = Pods({("tenant-a", "virt-launcher-done"): PodState(PodVerdict.FINAL, uid="u-1")})

    await make_agent(pods).cycle()

    assert pods.asked == [[("tenant-a", "virt-launcher-done"), ("tenant-a", "virt-launcher-up")]]
    assert [(d["allocatable"], d["allocated"]) for d in writer.written[0]["devices"]] == [(1, 0), (1, 1)]


async def test_nothing_is_rewritten_until_something_changes_or_the_report_interval_passes(
    tree: SysfsTree, kubelet: FakeKubelet, writer: RecordingWriter, make_agent: Callable[..., Agent], clock: FakeClock,
) -> None:
    hgx = layouts.hgx_passthrough(tree)
    kubelet.allocatable = [Device(hgx.resource, "30"), Device(hgx.resource, "120")]
    agent = make_agent()

    await agent.cycle()
    clock.advance(60)
    await agent.cycle()
    assert len(writer.written) == 1

    kubelet.allocatable = [Device(hgx.resource, "120")]  # a device went unhealthy
    await agent.cycle()
    assert len(writer.written) == 2
    assert [d["allocatable"] for d in writer.written[1]["devices"]] == [0, 1]

    clock.advance(119)
    await agent.cycle()
    assert len(writer.written) == 2
    clock.advance(1)
    await agent.cycle()
    assert len(writer.written) == 3
    assert writer.written[2]["agent"]["lastReport"] == "2026-12-02T09:33:00Z"


async def test_the_socket_missing_keeps_the_last_report_says_why_and_retries_with_backoff_until_it_appears(
    tree: SysfsTree, socket_path: str, kubelet_at: Callable[[str], Awaitable[FakeKubelet]],
    writer: RecordingWriter, make_agent: Callable[..., Agent],
) -> None:
    hgx = layouts.hgx_passthrough(tree)
    agent = make_agent()
    kubelet = await kubelet_at(socket_path)
    kubelet.allocatable = [Device(hgx.resource, "30")]
    assert await agent.cycle() == 15.0

    await kubelet.stop()
    await asyncio.to_thread(Path(socket_path).unlink, missing_ok=True)  # kubelet gone with its socket
    delays = [await agent.cycle() for _ in range(6)]

    assert delays == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    assert len(writer.written) == 2  # the reason once; not again while it stays the same
    kept = writer.written[1]
    assert set(kept) == {"agent"}, "devices, resourceNames and lastReport must be left as they are"
    assert "lastReport" not in kept["agent"]
    assert kept["agent"]["problems"][0].startswith(f"kubelet pod-resources socket {socket_path} is missing")
    assert kept["agent"]["problems"][-1] == "the last complete report is kept"

    kubelet = await kubelet_at(socket_path)
    kubelet.allocatable = [Device(hgx.resource, "30"), Device(hgx.resource, "120")]
    assert await agent.cycle() == 15.0
    assert [d["allocatable"] for d in writer.written[2]["devices"]] == [1, 1]
    assert writer.written[2]["agent"]["problems"] == []
    assert await agent.cycle() == 15.0


async def test_a_kubelet_error_before_any_report_writes_only_why(
    kubelet: FakeKubelet, writer: RecordingWriter, make_agent: Callable[..., Agent], tree: SysfsTree,
) -> None:
    layouts.hgx_passthrough(tree)
    kubelet.fail_with = grpc.StatusCode.RESOURCE_EXHAUSTED

    assert await make_agent().cycle() == 1.0

    (status,) = writer.written
    assert status == {"agent": {"version": "9.9.9", "problems": [
        "kubelet pod-resources GetAllocatableResources failed: RESOURCE_EXHAUSTED: GetAllocatableResources "
        "refused by the test (kubelet rate-limits this API)",
        "the last complete report is kept"]}}


async def test_a_sysfs_root_without_pci_devices_keeps_the_last_report(
    tmp_path: Path, kubelet: FakeKubelet, socket_path: str, writer: RecordingWriter, clock: FakeClock,
) -> None:
    agent = Agent(sysfs_root=tmp_path / "nothing", socket_path=socket_path, writer=writer, pod_lookup=Pods(),
                  clock=clock)

    await agent.cycle()

    (status,) = writer.written
    assert set(status) == {"agent"}
    assert "cannot list PCI devices" in status["agent"]["problems"][0]


async def test_bad_sysfs_content_is_reported_in_a_complete_report(
    tree: SysfsTree, kubelet: FakeKubelet, writer: RecordingWriter, make_agent: Callable[..., Agent],
) -> None:
    hgx = layouts.hgx_passthrough(tree)
    os.symlink("../../../devices/pci0000:99/0000:99:00.0", tree.root / "bus/pci/devices/0000:99:00.0")
    kubelet.allocatable = [Device(hgx.resource, "30")]

    await make_agent().cycle()

    (status,) = writer.written
    assert status["agent"]["problems"] == ["bus/pci/devices/0000:99:00.0: dangling link"]
    assert status["agent"]["lastReport"]
    assert len(status["devices"]) == 2


async def test_a_failed_write_is_retried_with_backoff_and_then_written(
    tree: SysfsTree, kubelet: FakeKubelet, writer: RecordingWriter, make_agent: Callable[..., Agent],
) -> None:
    layouts.hgx_passthrough(tree)
    agent = make_agent()
    writer.fail = kube_errors.Unavailable("connection refused")

    assert [await agent.cycle() for _ in range(3)] == [1.0, 2.0, 4.0]
    writer.fail = None
    assert await agent.cycle() == 15.0
    assert len(writer.written) == 1


async def test_once_writes_even_when_nothing_changed(
    tree: SysfsTree, kubelet: FakeKubelet, writer: RecordingWriter, make_agent: Callable[..., Agent],
) -> None:
    layouts.unbound_gpu(tree)
    agent = make_agent()

    first, _ = await agent.once()
    second, status = await agent.once()

    assert first.complete
    assert second == first
    assert len(writer.written) == 2
    assert status == writer.written[1]


async def test_run_reports_and_stops_when_told_without_waiting_out_the_interval(
    tree: SysfsTree, kubelet: FakeKubelet, writer: RecordingWriter, make_agent: Callable[..., Agent],
) -> None:
    layouts.unbound_gpu(tree)
    stop = asyncio.Event()
    running = asyncio.create_task(make_agent().run(stop))
    async with asyncio.timeout(5):
        await writer.wrote.wait()

    stop.set()

    async with asyncio.timeout(1):  # the interval is 15 s
        await running
    assert len(writer.written) == 1


def test_problems_are_capped_and_deduplicated() -> None:
    many = [f"problem {i}" for i in range(MAX_PROBLEMS + 10)]

    capped = cap_problems(["same", "same", *many])

    assert len(capped) == MAX_PROBLEMS
    assert capped[:2] == ["same", "problem 0"]
    assert capped[-1] == "... and 12 more"
