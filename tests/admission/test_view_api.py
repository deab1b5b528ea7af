"""The webhooks' snapshot follows the cache's events: a Node heartbeat derives nothing again, a change does.

On a fleet of heartbeating Nodes a snapshot rebuilt whenever an informer
moved made most webhook calls pay for every node; these check, on the real
API server, that a heartbeat keeps the nodes the snapshot was derived from,
that a label and an order are seen, and that the result is what a snapshot
built from scratch over the same stores gives.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs

from cozygpu.admission.view import SnapshotSource
from cozygpu.base.clock import FakeClock, utc_now
from cozygpu.cache.cache import Cache
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client
from cozygpu.model.snapshot import Snapshot
from cozygpu.views import specs
from cozygpu.views.build import build_snapshot
from tests.admission.harness import admission
from tests.binder.world import NODES, World, stamp
from tests.support.waiting import eventually


def version(cache: Cache, name: str) -> str:
    node = cache.store(specs.NODES).get("", name)
    meta = node.get("metadata") if node is not None else None
    return str((meta or {}).get("resourceVersion") or "")


def from_scratch(cache: Cache) -> Snapshot:
    def objects(spec: Any) -> Any:
        return cache.store(spec).list() if cache.is_served(spec) else ()

    return build_snapshot(
        now=utc_now(), classes=objects(specs.GPU_CLASSES), devices=objects(specs.GPU_DEVICES),
        gpunodes=objects(specs.GPU_NODES), nodes=objects(specs.NODES), pods=objects(specs.PODS),
        vmis=objects(specs.VMIS), quotas=objects(specs.TENANT_QUOTAS), namespaces=objects(specs.NAMESPACES),
        kubevirts=objects(specs.KUBEVIRTS))


@attrs.frozen
class Served:
    world: World
    node: str
    served: Any
    #: The webhooks' first snapshot that holds the node.
    first: Snapshot


@contextlib.asynccontextmanager
async def with_a_node(plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> AsyncIterator[Served]:
    """The webhooks served over a cache that has seen one GPU node (their snapshot holds it)."""
    world = await World.make(admin, namespace)
    try:
        node = await world.node("n1", 2)
        async with admission(plane, admin, namespace, tmp_path, register_hooks=False) as served:
            # Every kind first, the optional ones (KubeVirt's, DRA's) too: listed, or known not served. A built-in
            # one is not served until discovery says otherwise, then lists: a snapshot between reads "not ready"
            # (it failed so on 1.37, whose DeviceTaintRules is one more such kind).
            await eventually(lambda: _true(all(_known(served.cache, spec) for spec in specs.SNAPSHOT_SPECS.values())),
                             what="every kind of the snapshot listed or known not served")
            first = await eventually(lambda: _with(served.webhooks.source, node),
                                     what=f"{node} in the snapshot")
            yield Served(world, node, served, first)
    finally:
        await world.cleanup()


async def test_a_heartbeat_derives_no_node_again_and_a_label_and_an_order_are_seen(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    async with with_a_node(plane, admin, namespace, tmp_path) as rig:
        world, node, first = rig.world, rig.node, rig.first
        source, cache = rig.served.webhooks.source, rig.served.cache
        before, later = version(cache, node), utc_now() + timedelta(seconds=10)
        await admin.merge_patch(f"{NODES}/{node}/status", {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "Test", "lastHeartbeatTime": stamp(later),
             "lastTransitionTime": stamp()}]}})
        await eventually(lambda: _true(version(cache, node) != before), what="the heartbeat in the cache")
        beat = await source.snapshot()
        assert beat.nodes is first.nodes, "a heartbeat derived the nodes again"

        await admin.merge_patch(f"{NODES}/{node}", {"metadata": {"labels": {"view.test/x": "y"}}})
        labelled = await eventually(
            lambda: _labelled(source, node), what="the label in the webhooks' snapshot")
        assert labelled.nodes is not first.nodes

        await world.order("o1", 1)
        ordered = await eventually(lambda: _ordered(source, (namespace, "o1")),
                                   what="the order in the webhooks' snapshot")
        assert ordered.nodes is labelled.nodes, "an order derived the nodes again"

        scratch = from_scratch(cache)
        for field in ("devices", "nodes", "inventories", "capacity", "subtree_usage", "pending_usage",
                      "availability", "serving", "classes", "namespaces"):
            assert getattr(ordered, field) == getattr(scratch, field), field


async def _true(value: Any) -> Any:
    return value


def _known(cache: Cache, spec: Any) -> bool:
    informer = cache.informer(spec)
    return informer.has_synced or informer.served is False


async def _with(source: SnapshotSource, node: str) -> Snapshot | None:
    snapshot = await source.snapshot()
    return snapshot if node in snapshot.nodes else None


async def _labelled(source: SnapshotSource, node: str) -> Snapshot | None:
    snapshot = await source.snapshot()
    view = snapshot.nodes.get(node)
    return snapshot if view is not None and view.labels.get("view.test/x") == "y" else None


async def _ordered(source: SnapshotSource, key: tuple[str, str]) -> Snapshot | None:
    snapshot = await source.snapshot()
    return snapshot if key in snapshot.devices else None


async def test_the_webhooks_read_time_on_the_clock_they_are_given(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    """An hour on, by an injected clock, the agent's fresh report is stale to the webhooks' snapshot."""
    async with with_a_node(plane, admin, namespace, tmp_path) as rig:
        now, node = rig.first, rig.node
        assert now.inventories[node].fresh
        later = SnapshotSource(rig.served.cache, clock=FakeClock(wall_start=utc_now() + timedelta(hours=1)))
        snapshot = await later.snapshot()
        assert snapshot.now > now.now + timedelta(minutes=59)
        assert not snapshot.inventories[node].fresh, "the report's age was read on another clock"
