"""Which holds the ledger work judges when a class changes: those of a class whose idle-hold rule moved, and
no walk of the fleet for any other class change (a resource name, a selector)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import cast

import attrs

from cozygpu.base.clock import FakeClock
from cozygpu.binder.context import Context
from cozygpu.binder.housekeeping import LedgerWork
from cozygpu.model.derive import ModelTables
from cozygpu.model.snapshot import Phase, Snapshot
from tests.model.factories import NOW, device, gpu_class, gpu_nodes

HOLDS = tuple(device(f"h{i}", count=1, phase=Phase.BOUND, node="n0") for i in range(3))


def tables() -> tuple[ModelTables, Snapshot]:
    model = ModelTables()
    nodes, inventories = gpu_nodes(("n0", 4))
    first = model.rebuild(now=NOW, classes=[gpu_class()], devices=HOLDS, nodes=nodes, inventories=inventories,
                          pods=(), vmis=(), namespaces=())
    return model, first


def follow(work: LedgerWork, snapshot: Snapshot) -> list[tuple[str, str]]:
    work._follow(snapshot)
    return sorted(work.queue.take())


def test_only_a_change_of_a_classs_idle_hold_rule_judges_its_holds_again() -> None:
    model, first = tables()
    work = LedgerWork(cast(Context, SimpleNamespace(clock=FakeClock())))
    assert follow(work, first) == sorted(h.key for h in HOLDS), "a first look: every hold"
    renamed = model.update(now=NOW, devices={}, classes={"h100": attrs.evolve(gpu_class(), resource_name="x/B")})
    assert follow(work, renamed) == [], "another resource name: no idle-hold rule moved"
    ruled = model.update(now=NOW, devices={}, classes={
        "h100": attrs.evolve(gpu_class(), resource_name="x/B", idle_hold_limit=timedelta(hours=1))})
    assert follow(work, ruled) == sorted(h.key for h in HOLDS), "a new limit: each of its holds judged again"
