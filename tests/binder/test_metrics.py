"""The unit gauges follow the snapshot: a pass sets the class and device groups whose maps changed, and the
per-node families are rendered from the pass's snapshot only when scraped, each node's lines again only when
its figures moved."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cozygpu.binder.metrics import BinderMetrics, PerNodeUnits
from cozygpu.model.derive import ModelTables
from cozygpu.model.snapshot import Phase
from tests.model.factories import NOW, device, gpu_class, gpu_nodes
from tests.support.library_metrics import LibraryNodeFamilies


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


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parsed(text: str) -> Samples:
    """Every sample of an exposition, as Prometheus's text parser reads it."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def node_sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_a_pass_walks_no_node_and_a_scrape_reads_the_passs_snapshot() -> None:
    registry = CollectorRegistry()
    gauges = BinderMetrics.on(registry)
    resource = gpu_class().resource_name
    node_views, inventories = gpu_nodes(("n1", 4), ("n2", 4))
    tables = ModelTables()
    first = tables.rebuild(now=NOW, classes=[gpu_class()], devices=[device("d", phase=Phase.BOUND, node="n1")],
                             nodes=node_views, inventories=inventories, pods=(), vmis=(), namespaces=())
    held_n1 = {"node": "n1", "resource": resource, "state": "held"}
    assert node_sample(parsed(gauges.per_node.exposition().decode()), "cozygpu_binder_node_units",
                       **held_n1) is None, "no pass yet"
    gauges.observe_units(first)
    samples = parsed(gauges.per_node.exposition().decode())
    assert node_sample(samples, "cozygpu_binder_node_units", **held_n1) == 1
    assert node_sample(samples, "cozygpu_binder_node_units", node="n2", resource=resource, state="free") == 4

    second = tables.update(now=NOW, devices={("tenant-a", "e"): device("e", count=2, phase=Phase.BOUND,
                                                                         node="n2")})
    capacity, inventory = Read(second.capacity), Read(second.inventories)
    watched = attrs.evolve(second, capacity=capacity, inventories=inventory)
    gauges.observe_units(watched)
    assert (capacity.reads, inventory.reads) == (0, 0), "a pass sets nothing per node: not even the changed one"
    assert registry.get_sample_value("cozygpu_binder_devices", {"class": "h100", "phase": "Bound"}) == 2

    scraped = gauges.per_node.exposition().decode()
    assert capacity.reads > 0, "the scrape reads the pass's snapshot"
    assert inventory.reads > 0
    assert f'cozygpu_binder_node_units{{node="n2",resource="{resource}",state="held"}} 2.0' in scraped
    assert node_sample(parsed(scraped), "cozygpu_binder_node_report_timestamp_seconds", node="n1") == \
        inventories[0].last_report.timestamp()  # type: ignore[union-attr]
    assert "cozygpu_binder_node_units" not in generate_latest(registry).decode(), "rendered beside the registry"


def test_a_node_gone_from_the_snapshot_leaves_the_scrape() -> None:
    gauges = BinderMetrics.on(CollectorRegistry())
    node_views, inventories = gpu_nodes(("n1", 4), ("n2", 4))
    tables = ModelTables()
    gauges.observe_units(tables.rebuild(now=NOW, classes=[gpu_class()], devices=[], nodes=node_views,
                                          inventories=inventories, pods=(), vmis=(), namespaces=()))
    before = parsed(gauges.per_node.exposition().decode())
    assert node_sample(before, "cozygpu_binder_node_report_timestamp_seconds", node="n2") is not None
    gauges.observe_units(tables.rebuild(now=NOW, classes=[gpu_class()], devices=[], nodes=node_views[:1],
                                          inventories=inventories[:1], pods=(), vmis=(), namespaces=()))
    after = parsed(gauges.per_node.exposition().decode())
    assert node_sample(after, "cozygpu_binder_node_report_timestamp_seconds", node="n2") is None
    assert node_sample(after, "cozygpu_binder_node_units", node="n2", resource=gpu_class().resource_name,
                       state="served") is None
    assert node_sample(after, "cozygpu_binder_node_report_timestamp_seconds", node="n1") is not None


def test_a_scrape_after_a_node_moved_says_its_new_figures_and_keeps_the_others() -> None:
    gauges = BinderMetrics.on(CollectorRegistry())
    resource = gpu_class().resource_name
    node_views, inventories = gpu_nodes(("n1", 4), ("n2", 4), ("n3", 4))
    tables = ModelTables()
    gauges.observe_units(tables.rebuild(now=NOW, classes=[gpu_class()], devices=[], nodes=node_views,
                                          inventories=inventories, pods=(), vmis=(), namespaces=()))
    first = parsed(gauges.per_node.exposition().decode())
    later = NOW + dt.timedelta(seconds=90)
    moved_report = attrs.evolve(inventories[2], last_report=later)
    gauges.observe_units(tables.update(now=NOW, devices={("tenant-a", "e"): device(
        "e", count=3, phase=Phase.BOUND, node="n2")}, inventories={"n3": moved_report}))
    second = parsed(gauges.per_node.exposition().decode())

    def units(samples: Samples, node: str, state: str) -> float | None:
        return node_sample(samples, "cozygpu_binder_node_units", node=node, resource=resource, state=state)

    assert (units(first, "n2", "held"), units(first, "n2", "free")) == (0, 4)
    assert (units(second, "n2", "held"), units(second, "n2", "free")) == (3, 1), "the node a hold moved onto"
    assert node_sample(second, "cozygpu_binder_node_report_timestamp_seconds", node="n3") == later.timestamp()
    unmoved = {key: value for key, value in first.items() if ("node", "n2") not in key[1]
               and not (key[0] == "cozygpu_binder_node_report_timestamp_seconds" and ("node", "n3") in key[1])}
    assert unmoved
    assert {key: second[key] for key in unmoved} == unmoved, "the others as they were"
    assert len(second) == len(first)


def test_the_exposition_reads_as_the_librarys_rendering_of_the_same_families() -> None:
    per_node = PerNodeUnits()
    odd = 'gpu-"a"\\b\nc'  # quotes, a backslash and a newline: no node is named so, but a label may say it
    node_views, inventories = gpu_nodes((odd, 4), ("n2", 2))
    per_node.snapshot = ModelTables().rebuild(
        now=NOW, classes=[gpu_class()], devices=[device("d", phase=Phase.BOUND, node="n2")], nodes=node_views,
        inventories=[*inventories[:1], attrs.evolve(inventories[1], last_report=None)], pods=(), vmis=(),
        namespaces=())
    snapshot = per_node.snapshot

    library = CollectorRegistry()
    library.register(LibraryNodeFamilies(snapshot))
    ours = parsed(per_node.exposition().decode())
    assert ours == parsed(generate_latest(library).decode())
    assert node_sample(ours, "cozygpu_binder_node_units", node=odd, resource=gpu_class().resource_name,
                       state="served") == 4
    assert node_sample(ours, "cozygpu_binder_node_report_timestamp_seconds", node="n2") == 0.0
