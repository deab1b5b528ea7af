"""The hold ledger's metrics (R-LEDGER-1): made from the read model and the wall clock at scrape time, so two
replicas (or a leader and its successor) that read the same objects export the same numbers."""

from __future__ import annotations

import datetime as dt

import attrs
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cozygpu.admission.view import NotReady
from cozygpu.base.clock import FakeClock
from cozygpu.model.snapshot import Ledger, Phase, Snapshot
from cozygpu.runtime.ledger_metrics import LedgerMetrics
from tests.model.factories import NOW, device, gpu_class, gpu_nodes, pod, snapshot, vmi
from tests.support.library_metrics import LibraryLedgerFamilies

HOUR = dt.timedelta(hours=1)


def model() -> Snapshot:
    nodes, inventories = gpu_nodes(("n0", 8))
    idle = attrs.evolve(device("idle", count=3, phase=Phase.BOUND, node="n0"),
                        ledger=Ledger(held_since=NOW - 2 * HOUR, idle_since=NOW - HOUR, idle_seconds=600.0))
    running = attrs.evolve(device("run", count=2, phase=Phase.BOUND, node="n0", vmi="vm", vmi_uid="u"),
                           ledger=Ledger(held_since=NOW - 3 * HOUR))
    return snapshot(classes=[gpu_class()], nodes=nodes, inventories=inventories, devices=[idle, running],
                    vmis=[vmi("vm", uid="u", active=["uid-l"])],
                    pods=[pod("l", node_name="n0", uid="uid-l", claims_vmi=("tenant-a", "vm"))])


def parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scraped(collector: LedgerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return parsed(collector.exposition().decode())


async def test_two_replicas_reading_the_same_objects_export_the_same_figures_and_they_grow_with_time() -> None:
    clock = FakeClock(wall_start=NOW)

    async def source() -> Snapshot:
        return model()

    first, second = LedgerMetrics(source, clock=clock), LedgerMetrics(source, clock=clock)
    assert scraped(first) == {}, "nothing before the first refresh"
    await first.refresh()
    await second.refresh()
    now = scraped(first)
    assert now == scraped(second)
    tenant = (("class", "h100"), ("namespace", "tenant-a"))
    assert [now[("cozygpu_tenant_gpu_units", (*tenant, ("state", s)))] for s in ("held", "running", "idle")] == [
        5.0, 2.0, 3.0]
    idle_hold = (("class", "h100"), ("gpudevice", "idle"), ("namespace", "tenant-a"))
    assert now[("cozygpu_hold_unit_seconds_total", (*idle_hold, ("state", "idle")))] == 3 * (600 + 3600)
    clock.advance(1800)
    later = scraped(first)
    assert later[("cozygpu_hold_unit_seconds_total", (*idle_hold, ("state", "idle")))] == 3 * (600 + 5400)
    assert later[("cozygpu_hold_unit_seconds_total", (*idle_hold, ("state", "held")))] == 3 * 2.5 * 3600


async def test_a_replica_whose_cache_is_not_ready_keeps_the_last_figures() -> None:
    clock = FakeClock(wall_start=NOW)
    ready = [True]

    async def source() -> Snapshot:
        if not ready[0]:
            raise NotReady("not synced")
        return model()

    collector = LedgerMetrics(source, clock=clock)
    await collector.refresh()
    before = scraped(collector)
    ready[0] = False
    await collector.refresh()
    assert scraped(collector) == before


async def test_the_exposition_reads_as_the_librarys_rendering_of_the_same_families() -> None:
    clock = FakeClock(wall_start=NOW + HOUR)
    odd = attrs.evolve(device('x"y', namespace='tenant-\\b', phase=Phase.BOUND, node="n0"),
                       ledger=Ledger(held_since=NOW, idle_since=NOW))
    shown = attrs.evolve(model(), devices={**model().devices, ("tenant-\\b", 'x"y'): odd})

    async def source() -> Snapshot:
        return shown

    collector = LedgerMetrics(source, clock=clock)
    await collector.refresh()

    library = CollectorRegistry()
    library.register(LibraryLedgerFamilies(shown, clock.wall()))
    ours = scraped(collector)
    assert ours == parsed(generate_latest(library).decode())
    odd_hold = (("class", "h100"), ("gpudevice", 'x"y'), ("namespace", "tenant-\\b"))
    assert ours[("cozygpu_hold_unit_seconds_total", (*odd_hold, ("state", "held")))] == 3600.0
    assert len(ours) == 3 * 2 + 2 * 3, "two tenants' three figures, three holds' two"
