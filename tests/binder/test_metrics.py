"""The unit gauges follow the snapshot, and a group whose snapshot maps did not change is not walked again."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from prometheus_client import CollectorRegistry

from cozygpu.binder import metrics as binder_metrics
from cozygpu.binder.metrics import BinderMetrics
from cozygpu.model.assemble import Assembly
from cozygpu.model.snapshot import Phase
from tests.model.factories import NOW, device, gpu_class, gpu_nodes


def test_only_the_gauge_groups_whose_snapshot_maps_changed_are_set_again(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[str] = []
    nodes: list[list[str]] = []
    real_sync = binder_metrics._sync

    def counting(gauge: Any, have: Any, wanted: Any, scope: Any) -> None:
        walked.append(gauge._name)
        nodes.append(sorted({labels[0] for labels in wanted}))
        real_sync(gauge, have, wanted, scope)

    monkeypatch.setattr(binder_metrics, "_sync", counting)
    registry = CollectorRegistry()
    gauges = BinderMetrics.on(registry)
    node_views, inventories = gpu_nodes(("n1", 4), ("n2", 4))
    assembly = Assembly()
    snapshot = assembly.rebuild(now=NOW, classes=[gpu_class()], devices=[device("d", phase=Phase.BOUND, node="n1")],
                                nodes=node_views, inventories=inventories, pods=(), vmis=(), namespaces=())
    gauges.observe_units(snapshot)
    assert sorted(walked) == ["cozygpu_binder_node_report_timestamp_seconds", "cozygpu_binder_node_units"]
    assert registry.get_sample_value("cozygpu_binder_node_units", {"node": "n1", "resource": gpu_class().resource_name,
                                                                   "state": "held"}) == 1

    walked.clear()
    labelled = attrs.evolve(node_views[1], labels={"zone": "b"})
    gauges.observe_units(assembly.update(now=NOW, devices={}, nodes={"n2": labelled}))
    assert walked == [], "a Node label moves no unit: the fleet's node gauges are not walked again"

    gauges.observe_units(assembly.update(now=NOW, devices={("tenant-a", "e"): device(
        "e", count=2, phase=Phase.BOUND, node="n2")}))
    assert walked == ["cozygpu_binder_node_units"]
    assert nodes[-1] == ["n2"], "only the node the change log names is looked at"
    assert registry.get_sample_value("cozygpu_binder_node_units", {"node": "n2", "resource": gpu_class().resource_name,
                                                                   "state": "held"}) == 2
    assert registry.get_sample_value("cozygpu_binder_devices", {"class": "h100", "phase": "Bound"}) == 2
