"""Fixtures of the agent tests: sysfs trees and a kubelet on a unix socket, both in a tmp directory."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from cozygpu.devcluster.fake_kubelet import FakeKubelet
from cozygpu.devcluster.sysfs_tree import SysfsTree


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    """An empty sysfs tree (``bus/pci/devices`` and friends exist) under ``tmp_path/sys``."""
    return SysfsTree(tmp_path / "sys")


@pytest.fixture
def socket_path() -> Iterator[str]:
    """Where the fake kubelet listens: a short path, since unix socket paths stop at 107 bytes."""
    with tempfile.TemporaryDirectory(prefix="cozygpu-kubelet-") as directory:
        yield str(Path(directory) / "kubelet.sock")


@pytest.fixture
async def kubelet_at() -> AsyncIterator[Callable[[str], Awaitable[FakeKubelet]]]:
    """``await kubelet_at(path)``: a started fake kubelet, stopped after the test."""
    started: list[FakeKubelet] = []

    async def start(path: str) -> FakeKubelet:
        kubelet = await FakeKubelet(path).start()
        started.append(kubelet)
        return kubelet

    yield start
    for kubelet in started:
        await kubelet.stop()


@pytest.fixture
async def kubelet(socket_path: str, kubelet_at: Callable[[str], Awaitable[FakeKubelet]]) -> FakeKubelet:
    return await kubelet_at(socket_path)
