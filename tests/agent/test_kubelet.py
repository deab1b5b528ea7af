"""The pod-resources client against a gRPC server on a unix socket acting as kubelet."""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from cozygpu.agent.kubelet import DeviceIDs, KubeletUnavailable, PodDevices, held_ids, read_kubelet
from cozygpu.devcluster.fake_kubelet import Device, FakeKubelet, Pod

H100 = "nvidia.com/GH100_H100_SXM5_80GB"


async def test_allocatable_devices_and_pod_devices_are_read_with_their_numa_nodes(
    kubelet: FakeKubelet, socket_path: str,
) -> None:
    kubelet.allocatable = [Device(H100, "30", numa=(0,)), Device("devices.kubevirt.io/kvm", "kvm0")]
    kubelet.pods = [Pod("tenant-a", "virt-launcher-vm1-abcde", [
        ("compute", [Device(H100, "30", numa=(0,))]),
        ("sidecar", []),
    ])]

    view = await read_kubelet(socket_path)

    assert view.allocatable == (
        DeviceIDs(H100, ("30",), (0,)),
        DeviceIDs("devices.kubevirt.io/kvm", ("kvm0",), ()),
    )
    assert view.pods == (PodDevices("tenant-a", "virt-launcher-vm1-abcde", (DeviceIDs(H100, ("30",), (0,)),)),)
    assert set(kubelet.calls) == {"GetAllocatableResources", "List"}


async def test_an_id_repeated_for_two_numa_nodes_is_one_device(kubelet: FakeKubelet, socket_path: str) -> None:
    kubelet.allocatable = [Device(H100, "0000:18:00.0", numa=(0, 1)), Device(H100, "0000:9a:00.0", numa=(1,))]
    kubelet.pods = [Pod("ns", "p", [("c", [Device(H100, "0000:18:00.0", numa=(0, 1))])])]

    view = await read_kubelet(socket_path)

    assert len(view.allocatable) == 3  # as kubelet sends it
    assert view.allocatable_ids() == {H100: frozenset({"0000:18:00.0", "0000:9a:00.0"})}
    assert held_ids(view.pods[0]) == {H100: frozenset({"0000:18:00.0"})}


async def test_a_missing_socket_says_so(socket_path: str) -> None:
    with pytest.raises(KubeletUnavailable, match=r"socket .*kubelet\.sock is missing"):
        await read_kubelet(socket_path)


async def test_a_path_that_is_no_socket_says_so(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    path.write_text("")
    with pytest.raises(KubeletUnavailable, match="is not a socket"):
        await read_kubelet(str(path))


async def test_a_socket_nobody_listens_on_is_unavailable(socket_path: str) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(socket_path)
    listener.close()  # leaves the socket file, as a killed kubelet does

    with pytest.raises(KubeletUnavailable, match="GetAllocatableResources failed: UNAVAILABLE"):
        await read_kubelet(socket_path, timeout=5)


async def test_an_rpc_error_is_unavailable_with_its_code(kubelet: FakeKubelet, socket_path: str) -> None:
    kubelet.fail_with = grpc.StatusCode.UNIMPLEMENTED

    with pytest.raises(KubeletUnavailable, match=r"UNIMPLEMENTED: .*refused by the test \(kubelet too old"):
        await read_kubelet(socket_path)


async def test_a_kubelet_that_does_not_answer_in_time_is_unavailable(kubelet: FakeKubelet, socket_path: str) -> None:
    kubelet.delay = 5.0
    started = time.monotonic()

    with pytest.raises(KubeletUnavailable, match=r"DEADLINE_EXCEEDED|did not answer"):
        await read_kubelet(socket_path, timeout=0.3)

    assert time.monotonic() - started < 2.0


async def test_a_socket_missing_then_appearing_is_read_once_it_is_there(
    socket_path: str, kubelet_at: Callable[[str], Awaitable[FakeKubelet]],
) -> None:
    with pytest.raises(KubeletUnavailable, match="missing"):
        await read_kubelet(socket_path)

    kubelet = await kubelet_at(socket_path)
    kubelet.allocatable = [Device(H100, "30")]

    assert (await read_kubelet(socket_path)).allocatable_ids() == {H100: frozenset({"30"})}
