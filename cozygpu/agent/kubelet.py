"""kubelet's pod-resources API over its unix socket: what device plugins made of the node.

Two calls, both read-only (kubelet/sysfs reference §3):

- ``GetAllocatableResources``: every *healthy* device-plugin device, allocated
  or not. A device with NUMA affinity arrives once per NUMA node, so callers
  de-duplicate IDs per resource (``KubeletView.allocatable_ids``).
- ``List``: the devices each pod's app and sidecar containers hold. It carries
  no pod UID and no phase, and kubelet 1.32/1.33 still list pods in a final
  phase, so callers resolve the pods through the API before counting them.

The channel (``unix:PATH``) is opened per read: kubelet recreates the socket when it restarts,
and a read every few seconds does not need a kept connection. Every call has a
deadline. Every failure (socket missing, kubelet not answering, an RPC error)
is raised as ``KubeletUnavailable`` carrying a sentence for the GPUNode's
problems; nothing of grpc escapes this module.

The message classes come from ``podresources_pb2`` (generated from
``podresources.proto``, see its header) and are imported dynamically so that
type checking stays in this module: every message is turned into the frozen
classes below right here.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import stat
from collections.abc import Iterable
from typing import Any, Final

import attrs
import grpc

_pb2: Any = importlib.import_module("cozygpu.agent.podresources_pb2")

SERVICE: Final = "/v1.PodResourcesLister"
DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: Allocatable on a big node lists every CPU and memory block besides the devices.
_MAX_MESSAGE: Final = 32 * 1024 * 1024


class KubeletUnavailable(Exception):
    """kubelet's view could not be read; the message says why, for a person."""


@attrs.frozen
class DeviceIDs:
    """One ``ContainerDevices`` entry: device IDs of one resource, with their NUMA nodes."""

    resource_name: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@attrs.frozen
class PodDevices:
    """The devices one pod's containers hold, as ``List`` reports them."""

    namespace: str
    name: str
    devices: tuple[DeviceIDs, ...]


@attrs.frozen
class KubeletView:
    allocatable: tuple[DeviceIDs, ...]
    pods: tuple[PodDevices, ...]

    def allocatable_ids(self) -> dict[str, frozenset[str]]:
        """resource name -> its distinct allocatable device IDs (repeats per NUMA node collapse)."""
        return _ids_by_resource(self.allocatable)


def _ids_by_resource(entries: Iterable[DeviceIDs]) -> dict[str, frozenset[str]]:
    collected: dict[str, set[str]] = {}
    for entry in entries:
        collected.setdefault(entry.resource_name, set()).update(entry.device_ids)
    return {name: frozenset(ids) for name, ids in collected.items()}


def held_ids(pod: PodDevices) -> dict[str, frozenset[str]]:
    """resource name -> the distinct device IDs a pod holds over all its containers."""
    return _ids_by_resource(pod.devices)


def _check_socket(path: str) -> str | None:
    """A sentence when ``path`` is no socket kubelet could be listening on, else ``None``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"kubelet pod-resources socket {path} is missing (is kubelet running, is the path right?)"
    except OSError as err:
        return f"kubelet pod-resources socket {path} cannot be examined: {err.strerror or err}"
    if not stat.S_ISSOCK(mode):
        return f"kubelet pod-resources path {path} is not a socket"
    return None


async def read_kubelet(socket_path: str, *, timeout: float = 10.0) -> KubeletView:
    """Read allocatable devices and pod devices from kubelet at ``socket_path``."""
    problem = await asyncio.to_thread(_check_socket, socket_path)
    if problem is not None:
        raise KubeletUnavailable(problem)
    target = "unix:" + socket_path  # grpc's form for an absolute or a relative path
    options = [("grpc.max_receive_message_length", _MAX_MESSAGE)]
    try:
        async with asyncio.timeout(timeout), grpc.aio.insecure_channel(target, options=options) as channel:
            allocatable = await _call(channel, "GetAllocatableResources", _pb2.AllocatableResourcesRequest(),
                                      _pb2.AllocatableResourcesResponse, timeout)
            listed = await _call(channel, "List", _pb2.ListPodResourcesRequest(),
                                 _pb2.ListPodResourcesResponse, timeout)
    except TimeoutError:
        raise KubeletUnavailable(f"kubelet pod-resources at {socket_path} did not answer in {timeout:g}s") from None
    return KubeletView(
        allocatable=tuple(_devices(allocatable.devices)),
        pods=tuple(_pods(listed.pod_resources)),
    )


async def _call(channel: Any, name: str, request: Any, response_type: Any, timeout: float) -> Any:
    method = channel.unary_unary(
        f"{SERVICE}/{name}",
        request_serializer=type(request).SerializeToString,
        response_deserializer=response_type.FromString,
    )
    try:
        return await method(request, timeout=timeout)
    except grpc.aio.AioRpcError as err:
        code = err.code()
        hint = ""
        if code == grpc.StatusCode.UNIMPLEMENTED:
            hint = " (kubelet too old for this call?)"
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            hint = " (kubelet rate-limits this API)"
        raise KubeletUnavailable(
            f"kubelet pod-resources {name} failed: {code.name}: {err.details()}{hint}") from None


def _devices(entries: Iterable[Any]) -> Iterable[DeviceIDs]:
    for entry in entries:
        numa = tuple(int(node.ID) for node in entry.topology.nodes) if entry.HasField("topology") else ()
        yield DeviceIDs(
            resource_name=str(entry.resource_name),
            device_ids=tuple(str(device_id) for device_id in entry.device_ids),
            numa_nodes=numa,
        )


def _pods(entries: Iterable[Any]) -> Iterable[PodDevices]:
    for pod in entries:
        devices = tuple(device for container in pod.containers for device in _devices(container.devices))
        yield PodDevices(namespace=str(pod.namespace), name=str(pod.name), devices=devices)
