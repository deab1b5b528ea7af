"""The always-on reconcilers judge only the objects their events name (R-BIND-9, R-BIND-3).

Finalizers and usage records read classes, devices, VMIs and Cozystack's usage
kinds, keyed by object. A pass caused by a Node label has no key for them: they
judge nothing, so the pass does not walk every device of the fleet for them. A
new device is judged, and only it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cozygpu.binder import finalizers
from cozygpu.kube import Client
from cozygpu.views import specs
from tests.binder.world import NODES, World, running_binder, seen_by


async def test_a_node_label_runs_no_reconciler_and_a_new_order_does(
        admin: Client, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    world = await World.make(admin, namespace)
    node = await world.node("n1", 2)
    try:
        async with running_binder(admin) as running:
            ran: list[str] = []
            real: Callable[..., Any] = finalizers.judge_device

            def counted(device: Any, *args: Any, **kw: Any) -> Any:
                ran.append(device["metadata"]["name"])
                return real(device, *args, **kw)

            monkeypatch.setattr(finalizers, "judge_device", counted)
            for _ in range(10):  # settled: what earlier tests left in the shared plane may take passes to settle
                ran.clear()
                await running.each_lane()
                if not ran:
                    break
            else:
                raise AssertionError("the reconcilers found something to do in ten passes running")

            labelled = await admin.merge_patch(f"{NODES}/{node}", {"metadata": {"labels": {"zone": "b"}}})
            await seen_by(running, specs.NODES.key, labelled)
            await running.each_lane()
            assert ran == [], "a Node label moved nothing the reconcilers read"

            order = await world.order("new", 1)
            await seen_by(running, specs.GPU_DEVICES.key, order)
            await running.each_lane()
            assert ran == ["new"], "a new device is the finalizer's to look at, and only it"
    finally:
        await world.cleanup()
