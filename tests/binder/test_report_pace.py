"""How many reports one report pass writes, and when it asks for the next (no API server: nothing is sent)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from cozygpu.base.clock import FakeClock
from cozygpu.binder.binder import Binder, BinderConfig
from cozygpu.binder.reports import StatusWrite
from cozygpu.cache.cache import Cache
from cozygpu.kube import Client


def report(name: str) -> StatusWrite:
    return StatusWrite(kind="GPUNode", path=f"/gpunodes/{name}/status", resource_version="1", status={},
                       what=f"GPUNode {name}")


def binder(clock: FakeClock, **config: Any) -> Binder:
    client = Client("https://127.0.0.1:9", ssl_context=None)
    return Binder(Cache(client, registry=CollectorRegistry()), client,
                  BinderConfig(identity="t", **config), clock=clock)


def test_a_fleets_first_reports_go_out_a_few_a_pass_and_each_pass_asks_at_once_for_the_next() -> None:
    clock = FakeClock()
    paced = binder(clock, reports_per_pass=2, report_every=timedelta(seconds=1))
    asked: list[float] = []
    paced.reports.on_due(lambda: asked.append(clock.now()))
    fleet = [report(f"n{i}") for i in range(5)]
    written: list[str] = []
    for _ in range(3):
        due = paced.reports._due([w for w in fleet if w.what not in written])
        written += [w.what for w in due]
        assert len(due) <= 2
        clock.advance(0)  # the reminder, if one was set, is due at once
    assert written == [w.what for w in fleet], "every report was written, in order, none twice"
    assert asked == [0.0, 0.0], "the first two passes left reports and asked for the next at once; the last did not"


def test_a_report_changed_again_within_the_interval_waits_for_its_end() -> None:
    clock = FakeClock()
    paced = binder(clock, report_every=timedelta(seconds=1))
    asked: list[float] = []
    paced.reports.on_due(lambda: asked.append(clock.now()))
    assert paced.reports._due([report("n0")]) == [report("n0")]
    clock.advance(0.25)
    assert paced.reports._due([report("n0")]) == [], "written again within the interval"
    clock.advance(0.5)
    assert asked == []
    clock.advance(0.25)
    assert asked == [1.0], "the reminder came when the interval after the last write was over"
    assert paced.reports._due([report("n0")]) == [report("n0")]


def test_a_pass_whose_judgement_left_gpunodes_for_later_asks_at_once_for_the_next() -> None:
    """Judging stops at the pass's limit (``report_writes(limit=…)``): the nodes left need another pass soon,
    even when what was judged fits in this one."""
    clock = FakeClock()
    paced = binder(clock, reports_per_pass=2, report_every=timedelta(seconds=1))
    asked: list[float] = []
    paced.reports.on_due(lambda: asked.append(clock.now()))
    paced.reports._memo.left = 3
    assert paced.reports._due([report("n0")]) == [report("n0")]
    clock.advance(0)
    assert asked == [0.0], "three GPUNodes were not judged: the next pass is asked for at once"
