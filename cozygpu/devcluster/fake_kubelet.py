"""A kubelet pod-resources server on a unix socket, answering what a test sets.

It speaks the generated ``v1.PodResourcesLister`` service, so the agent's
client is exercised over real gRPC. Entries are given as kubelet builds them:
one ``ContainerDevices`` per device, repeated per NUMA node when a test says so.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import attrs
import grpc

# Generated code carries no types: imported as Any, as the agent's client does.
pb: Any = importlib.import_module("cozygpu.agent.podresources_pb2")
pb_grpc: Any = importlib.import_module("cozygpu.agent.podresources_pb2_grpc")


@attrs.define
class Device:
    resource: str
    id: str
    numa: tuple[int, ...] = ()


@attrs.define
class Pod:
    namespace: str
    name: str
    #: (container name, devices)
    containers: list[tuple[str, list[Device]]]


def _entries(devices: list[Device]) -> list[Any]:
    entries = []
    for device in devices:
        if device.numa:
            for node in device.numa:  # kubelet repeats a device once per NUMA node
                topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=node)])
                entries.append(pb.ContainerDevices(resource_name=device.resource, device_ids=[device.id],
                                                   topology=topology))
        else:
            entries.append(pb.ContainerDevices(resource_name=device.resource, device_ids=[device.id]))
    return entries


class FakeKubelet:
    """The servicer of ``v1.PodResourcesLister`` (its three methods) and the server around it."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.allocatable: list[Device] = []
        self.pods: list[Pod] = []
        #: When set, every call fails with this code.
        self.fail_with: grpc.StatusCode | None = None
        #: Seconds each call waits before answering.
        self.delay: float = 0.0
        self.calls: list[str] = []
        self._server: Any = None

    async def start(self) -> FakeKubelet:
        self._server = grpc.aio.server()
        pb_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port("unix:" + self.socket_path)
        await self._server.start()
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def _answer(self, name: str, context: Any) -> None:
        self.calls.append(name)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_with is not None:
            await context.abort(self.fail_with, f"{name} refused by the test")

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        await self._answer("GetAllocatableResources", context)
        return pb.AllocatableResourcesResponse(devices=_entries(self.allocatable), cpu_ids=[0, 1, 2, 3])

    async def List(self, request: Any, context: Any) -> Any:
        await self._answer("List", context)
        return pb.ListPodResourcesResponse(pod_resources=[
            pb.PodResources(
                namespace=pod.namespace,
                name=pod.name,
                containers=[pb.ContainerResources(name=name, devices=_entries(devices)) for name, devices in
                            pod.containers],
            )
            for pod in self.pods
        ])

    async def Get(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the agent does not call Get")
