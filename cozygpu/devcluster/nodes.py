"""Simulated GPU nodes: kwok-managed Nodes the real kube-scheduler can place pods on.

One way for everyone (the CLI's ``cozygpu cluster nodes``, the demo, the tests
and the benchmarks): a Node created with its status filled in — capacity and
allocatable carrying the GPU resource names beside cpu, memory and pods (the
API server takes a Node's status on create) — and the annotation kwok selects
by (``plane.SIMULATED_NODE``), so kwok keeps it Ready with lease heartbeats and
runs the pods bound to it; no other Node is touched. Cordon it with plain
``kubectl cordon``.

A fleet is created with bounded concurrency (``add_nodes``), not one round
trip after another. Removing a node deletes the Node and its GPUNode, if an
agent wrote one (nothing owns a GPUNode, so no garbage collector would); a
node whose agent still runs (``simnodes``) has that process ended first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import attrs

from cozygpu import keys
from cozygpu.devcluster.plane import SIMULATED_NODE
from cozygpu.kube import Client, errors, resource_path

NODES = resource_path("", "v1", "nodes")
GPUNODES = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)
NODE_LEASES = resource_path("coordination.k8s.io", "v1", "leases", namespace="kube-node-lease")
#: Who holds a node's Lease while its heartbeats are stopped (kwok renews only Leases it holds).
HEARTBEATS_STOPPED = "cozygpu-heartbeats-stopped"
#: Concurrent requests while creating or deleting a fleet (the client's pool holds 64).
CONCURRENCY = 32


class NodeSpecError(ValueError):
    """A node description a person typed that cannot become a Node."""


@attrs.frozen
class SimNode:
    """A simulated node: its GPU resource names with unit counts, labels and taints."""

    name: str
    gpus: Mapping[str, int] = attrs.field(factory=dict)
    labels: Mapping[str, str] = attrs.field(factory=dict)
    #: Taints as the Node API writes them: ``{"key", "value"?, "effect"}``.
    taints: Sequence[Mapping[str, str]] = ()
    cpu: str = "64"
    memory: str = "512Gi"
    pods: str = "110"

    def body(self) -> dict[str, Any]:
        resources = {"cpu": self.cpu, "memory": self.memory, "pods": self.pods,
                     **{name: str(count) for name, count in self.gpus.items()}}
        spec: dict[str, Any] = {}
        if self.taints:
            spec["taints"] = [dict(taint) for taint in self.taints]
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": self.name,
                "annotations": {SIMULATED_NODE: "true", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok", **self.labels},
            },
            "spec": spec,
            "status": {"capacity": resources, "allocatable": dict(resources)},
        }


def parse_gpus(values: Iterable[str]) -> dict[str, int]:
    """``NAME=COUNT`` entries (``nvidia.com/GH100_H100_SXM5_80GB=8``) into a mapping."""
    gpus: dict[str, int] = {}
    for value in values:
        name, sep, count = value.rpartition("=")
        if not sep or not name or not count.isdigit() or int(count) < 1:
            raise NodeSpecError(f"--gpus {value!r}: expected RESOURCE_NAME=COUNT with COUNT ≥ 1")
        gpus[name] = gpus.get(name, 0) + int(count)
    return gpus


def parse_labels(values: Iterable[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not key:
            raise NodeSpecError(f"--label {value!r}: expected KEY=VALUE")
        labels[key] = label
    return labels


def parse_taint(value: str) -> dict[str, str]:
    """``key[=value]:Effect``, as ``kubectl taint`` writes it."""
    head, sep, effect = value.rpartition(":")
    if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute") or not head:
        raise NodeSpecError(f"--taint {value!r}: expected KEY[=VALUE]:NoSchedule|PreferNoSchedule|NoExecute")
    key, has_value, taint_value = head.partition("=")
    taint = {"key": key, "effect": effect}
    if has_value:
        taint["value"] = taint_value
    return taint


async def _bounded(calls: Iterable[Any], limit: int) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(call: Any) -> None:
        async with gate:
            await call

    async with asyncio.TaskGroup() as group:
        for call in calls:
            group.create_task(one(call))


async def add_nodes(client: Client, nodes: Sequence[SimNode], *, concurrency: int = CONCURRENCY) -> None:
    """Create the Nodes (an existing one of that name is replaced), ``concurrency`` requests at a time."""

    async def create(node: SimNode) -> None:
        try:
            await client.create(NODES, node.body())
        except errors.AlreadyExists:
            await client.delete(f"{NODES}/{node.name}")
            await client.create(NODES, node.body())

    await _bounded((create(node) for node in nodes), concurrency)


async def remove_nodes(client: Client, names: Iterable[str], *, concurrency: int = CONCURRENCY) -> None:
    """Delete the Nodes and their GPUNode reports (absent ones, or an uninstalled GPUNode CRD, are fine)."""

    async def delete(name: str) -> None:
        for path in (f"{NODES}/{name}", f"{GPUNODES}/{name}"):
            with contextlib.suppress(errors.NotFound):
                await client.delete(path)

    await _bounded((delete(name) for name in names), concurrency)


async def stop_heartbeats(client: Client, name: str) -> None:
    """Stop a simulated node's heartbeats, as a node that died would, with kwok still running.

    kwok renews only the Leases it holds, so taking the node's Lease over for an
    hour stops its renewals; after one node-lease duration the real
    node-lifecycle controller marks the node NotReady and taints it unreachable
    — provided some node of the zone is still Ready (with every node NotReady
    it enters full disruption mode and taints none).

    The takeover is written as one last renewal (``renewTime`` now): the
    node-lifecycle controller keeps the Lease it last saw renewed and, before
    it marks a node NotReady, compares that copy's resourceVersion with the
    live Lease's (1.37's lease circuit breaker). A Lease changed without a
    newer ``renewTime`` never replaces its copy, so the two never match and the
    node stays Ready for good (``read version … is not as new as written
    version`` in its log) — whenever the controller had seen kwok's last
    renewal before the takeover.
    """
    path = f"{NODE_LEASES}/{name}"
    lease = await client.get(path)
    renewed = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease["spec"].update(holderIdentity=HEARTBEATS_STOPPED, leaseDurationSeconds=3600, renewTime=renewed)
    await client.replace(path, lease)


async def resume_heartbeats(client: Client, name: str) -> None:
    """Give a node's Lease back: kwok creates a new one and renews it again."""
    with contextlib.suppress(errors.NotFound):
        await client.delete(f"{NODE_LEASES}/{name}")


def is_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def schedulable_taints(node: Mapping[str, Any]) -> list[str]:
    """The node-lifecycle taints that still keep pods off a node (not-ready, unreachable)."""
    lifecycle = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
    return [t["key"] for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") in lifecycle]


async def wait_ready(client: Client, names: Iterable[str], *, timeout: float = 60.0) -> float:
    """Wait until every named node is Ready and free of not-ready/unreachable taints; returns seconds waited.

    Reads through one watch of all Nodes (a fleet is not polled node by node).
    """
    waiting = set(names)
    started = time.monotonic()
    async with asyncio.timeout(timeout):
        while waiting:
            listed = await client.list_objects(NODES)
            for node in listed.get("items") or []:
                if is_ready(node) and not schedulable_taints(node):
                    waiting.discard(node["metadata"]["name"])
            if not waiting:
                break
            version = listed["metadata"]["resourceVersion"]
            with contextlib.suppress(errors.Gone, errors.Unavailable):
                async for event in client.watch(NODES, params={"resourceVersion": version}, read_timeout=timeout):
                    node = event.get("object") or {}
                    name = (node.get("metadata") or {}).get("name")
                    if name in waiting and is_ready(node) and not schedulable_taints(node):
                        waiting.discard(name)
                        if not waiting:
                            break
    return time.monotonic() - started
