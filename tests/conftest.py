"""Fixtures over the real control plane (the project's envtest).

- ``plane``: a running etcd + kube-apiserver with the chart's CRDs installed,
  one per Kubernetes minor per test session, started on first use. Tests
  marked ``both_minors`` run once per supported minor (``binaries.MINORS``: 1.37, 1.33); the rest
  use the current minor.
- ``full_plane``: the whole local plane (kube-controller-manager,
  kube-scheduler and kwok besides etcd and kube-apiserver) on the current
  minor, one per session, started on first use: only tests that need real
  scheduling, namespace deletion, garbage collection or node lifecycle ask for
  it. A component that dies fails the test that was running, with the tail of
  its log. ``full_admin`` is its admin client.
- ``fleet(*nodes)``: creates simulated GPU nodes (``cozygpu.devcluster.nodes.SimNode``)
  on the full plane in bulk, waits until kwok holds them Ready, and removes them
  after the test.
- ``admin``: a ``cozygpu.kube.Client`` in ``system:masters``.
- ``namespace``: a fresh namespace per test (never deleted: without
  kube-controller-manager a namespace deletion never finishes).
- ``client_for(user, groups)``: a factory of clients acting as other people
  (client certificates from the plane's client CA), e.g. a tenant user in
  Cozystack's groups or ``system:kube-controller-manager``; pod-bound
  service-account tokens come from ``plane.service_account_token``.

The binaries are built by ``python -m cozygpu.devcluster.binaries`` (the
README's test command runs it first). When they are missing, a test that needs
the control plane skips locally with the command to run, and **fails** under
``CI=true``: CI must never pass by skipping.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import hypothesis
import pytest

from cozygpu.devcluster import apply, binaries, nodes
from cozygpu.devcluster.plane import ControlPlane, ControlPlaneError
from cozygpu.kube import Client, resource_path
from tests.support.planes import Fleet, unavailable

MINORS = binaries.MINORS

# Hypothesis's per-example deadline is a timed assertion: on two shared cores (a build, another test's plane)
# an example can take a second without anything being wrong, and the run then fails as "flaky". Speed is the
# benches' to show, never a test's.
hypothesis.settings.register_profile("cozygpu", deadline=None)
hypothesis.settings.load_profile("cozygpu")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "plane" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_minors"):
        metafunc.parametrize("plane", MINORS, indirect=True, ids=[f"k8s{m}" for m in MINORS])


class _Planes:
    """Control planes by minor, started on first use, stopped at session end."""

    def __init__(self) -> None:
        self.running: dict[tuple[str, bool], ControlPlane] = {}
        self.failed: dict[tuple[str, bool], str] = {}

    def get(self, minor: str, *, full: bool = False) -> ControlPlane:
        key = (minor, full)
        if key in self.failed:
            unavailable(self.failed[key])
        if key not in self.running:
            try:
                plane = ControlPlane.start(minor=minor, build=False, full=full)
            except ControlPlaneError as err:
                self.failed[key] = str(err)
                unavailable(str(err))
            self.running[key] = plane
            _run(_install_crds(plane))
        return self.running[key]

    def stop_all(self) -> None:
        for plane in self.running.values():
            plane.stop()


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Run set-up I/O on a loop of its own thread, away from pytest-asyncio's session loop."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result()


async def _install_crds(plane: ControlPlane) -> None:
    async with plane.client() as admin:
        await apply.install_crds(admin)


@pytest.fixture(scope="session")
def _planes() -> Iterator[_Planes]:
    planes = _Planes()
    yield planes
    planes.stop_all()


@pytest.fixture
def plane(request: pytest.FixtureRequest, _planes: _Planes) -> ControlPlane:
    minor: str = getattr(request, "param", binaries.DEFAULT_MINOR)
    return _planes.get(minor)


@pytest.fixture
def full_plane(_planes: _Planes) -> Iterator[ControlPlane]:
    plane = _planes.get(binaries.DEFAULT_MINOR, full=True)
    plane.check()
    yield plane
    plane.check()


@pytest.fixture
async def full_admin(full_plane: ControlPlane) -> AsyncIterator[Client]:
    async with full_plane.client() as client:
        yield client


@pytest.fixture
async def fleet(full_admin: Client) -> AsyncIterator[Fleet]:
    made: list[str] = []

    async def make(*simulated: nodes.SimNode, timeout: float = 120.0) -> list[str]:
        names = [node.name for node in simulated]
        made.extend(names)
        await nodes.add_nodes(full_admin, simulated)
        await nodes.wait_ready(full_admin, names, timeout=timeout)
        return names

    yield make
    await nodes.remove_nodes(full_admin, made)


@pytest.fixture
async def admin(plane: ControlPlane) -> AsyncIterator[Client]:
    async with plane.client() as client:
        yield client


@pytest.fixture
async def namespace(admin: Client) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": name}})
    return name


@pytest.fixture
async def client_for(plane: ControlPlane) -> AsyncIterator[Callable[[str, Sequence[str]], Client]]:
    """``client_for(user, groups)``: a client acting as that person (closed after the test)."""
    made: list[Client] = []

    def make(user: str, groups: Sequence[str] = ()) -> Client:
        client = plane.client(user, groups)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()
