"""The unit gauges follow the snapshot: a pass sets the class and device groups whose maps changed, and the
per-node families are read from the pass's snapshot only when scraped."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, generate_latest

from cozygpu.binder.metrics import BinderMetrics
from cozygpu.model.derive import ModelTables
from cozygpu.model.snapshot import Phase
from tests.model.factories import NOW, device, gpu_class, gpu_nodes


class Read(Mapping[str, Any]):
    """A snapshot map that counts every read of it (a key looked up, or a walk over it)."""

    def __init__(self, inner: Mapping[str, Any]) -> None:
        self.inner, self.reads = inner, 0

    def __getitem__(self, key: str) -> Any:
        self.reads += 1
        return self.inner[key]

    def __iter__(self) -> Iterator[str]:
        self.reads += 1
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


def test_a_pass_walks_no_node_and_a_scrape_reads_the_passs_snapshot() -> None:
    registry = CollectorRegistry()
    gauges = BinderMetrics.on(registry)
    resource = gpu_class().resource_name
    node_views, inventories = gpu_nodes(("n1", 4), ("n2", 4))
    tables = ModelTables()
    first = tables.rebuild(now=NOW, classes=[gpu_class()], devices=[device("d", phase=Phase.BOUND, node="n1")],
                             nodes=node_views, inventories=inventories, pods=(), vmis=(), namespaces=())
    assert registry.get_sample_value("cozygpu_binder_node_units", {"node": "n1", "resource": resource,
                                                                   "state": "held"}) is None, "no pass yet"
    gauges.observe_units(first)
    assert registry.get_sample_value("cozygpu_binder_node_units", {"node": "n1", "resource": resource,
                                                                   "state": "held"}) == 1
    assert registry.get_sample_value("cozygpu_binder_node_units", {"node": "n2", "resource": resource,
                                                                   "state": "free"}) == 4

    second = tables.update(now=NOW, devices={("tenant-a", "e"): device("e", count=2, phase=Phase.BOUND,
                                                                         node="n2")})
    capacity, inventory = Read(second.capacity), Read(second.inventories)
    watched = attrs.evolve(second, capacity=capacity, inventories=inventory)
    gauges.observe_units(watched)
    assert (capacity.reads, inventory.reads) == (0, 0), "a pass sets nothing per node: not even the changed one"
    assert registry.get_sample_value("cozygpu_binder_devices", {"class": "h100", "phase": "Bound"}) == 2

    scraped = generate_latest(registry).decode()
    assert capacity.reads > 0, "the scrape reads the pass's snapshot"
    assert inventory.reads > 0
    assert f'cozygpu_binder_node_units{{node="n2",resource="{resource}",state="held"}} 2.0' in scraped
    assert 'cozygpu_binder_node_report_timestamp_seconds{node="n1"}' in scraped


def test_a_node_gone_from_the_snapshot_leaves_the_scrape() -> None:
    registry = CollectorRegistry()
    gauges = BinderMetrics.on(registry)
    node_views, inventories = gpu_nodes(("n1", 4), ("n2", 4))
    tables = ModelTables()
    gauges.observe_units(tables.rebuild(now=NOW, classes=[gpu_class()], devices=[], nodes=node_views,
                                          inventories=inventories, pods=(), vmis=(), namespaces=()))
    assert registry.get_sample_value("cozygpu_binder_node_report_timestamp_seconds", {"node": "n2"}) is not None
    gauges.observe_units(tables.rebuild(now=NOW, classes=[gpu_class()], devices=[], nodes=node_views[:1],
                                          inventories=inventories[:1], pods=(), vmis=(), namespaces=()))
    assert registry.get_sample_value("cozygpu_binder_node_report_timestamp_seconds", {"node": "n2"}) is None
    assert registry.get_sample_value("cozygpu_binder_node_units", {"node": "n2", "resource": gpu_class().resource_name,
                                                                   "state": "served"}) is None
