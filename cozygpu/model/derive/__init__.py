"""Derive a Snapshot from typed views: the effective names, budgets and every index, kept up to date.

Why: every question the model answers (a catalog entry, an order check, a
placement) reads the same derived tables; computing them per question would
make the catalog O(all devices). Callers convert their cache into views
(``cozygpu.views.live`` does it for the informer cache) and call
:func:`derive_snapshot`, or keep a :class:`ModelTables` and ``update`` it;
tests call either with hand-made views.

The parts, each owning its state: ``devices`` (the device index),
``usage`` (tenant usage, R-MOD-4), ``nodes`` (the node ledger and report
clock, R-MOD-7), ``availability`` (classes and their availability, R-MOD-8,
R-MOD-12), ``launching`` (the launcher index and pods' contributions,
R-MOD-5/6), ``names`` (the effective names, R-MOD-9); ``contributions``
routes each object's contribution to them and ``core`` orders a change's
steps. A from-scratch build adds every object's contribution to an empty
model and refreshes every node touched, as an update does for the few it
changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from cozygpu.model import capacity as cap
from cozygpu.model.derive.core import KEEP, ModelTables
from cozygpu.model.derive.shared import STEP, drain
from cozygpu.model.snapshot import (
    DeviceView,
    DraGroup,
    GPUClassView,
    NamespaceView,
    NodeInventory,
    NodeView,
    PermittedHostDevices,
    PodView,
    Snapshot,
    VMIView,
)

__all__ = ["KEEP", "STEP", "ModelTables", "derive_snapshot", "drain"]


def derive_snapshot(
    *,
    now: datetime,
    classes: Iterable[GPUClassView] = (),
    devices: Iterable[DeviceView] = (),
    nodes: Iterable[NodeView] = (),
    inventories: Iterable[NodeInventory] = (),
    pods: Iterable[PodView] = (),
    vmis: Iterable[VMIView] = (),
    namespaces: Iterable[NamespaceView] = (),
    quotas: Mapping[str, Mapping[str, object]] | None = None,
    hoster_names: Iterable[str] = (),
    permitted: PermittedHostDevices | None = None,
    report_stale_after: timedelta = cap.DEFAULT_REPORT_STALE_AFTER,
    launcher_grace: timedelta = cap.DEFAULT_LAUNCHER_GRACE,
    dra: Mapping[str, Mapping[str, int]] | None = None,
    dra_raw: Mapping[str, Mapping[str, int]] | None = None,
    dra_problems: Mapping[str, tuple[str, ...]] | None = None,
    dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] | None = None,
) -> Snapshot:
    """A Snapshot of these views: an empty :class:`ModelTables` rebuilt from them. ``quotas`` maps a tenant
    namespace to its ``tenant-quota`` ``spec.hard``; ``dra``: node -> what DRA-sourced classes serve there,
    ``dra_raw``: namespace -> the units its own claims hold (``model.dra.dra_served``)."""
    tables = ModelTables(hoster_names=hoster_names, report_stale_after=report_stale_after,
                         launcher_grace=launcher_grace)
    return tables.rebuild(now=now, classes=classes, devices=devices, nodes=nodes, inventories=inventories,
                          pods=pods, vmis=vmis, namespaces=namespaces, quotas=quotas, permitted=permitted,
                          dra=dra, dra_raw=dra_raw, dra_problems=dra_problems, dra_groups=dra_groups)
