"""Units a node serves, holds and has free, per resource name (R-MOD-7).

Why: the VMI webhook once counted one unit per healthy GPU function while
the binder counted device-plugin devices, so an mdev parent's remaining
slots were served for one and missing for the other. Units are now counted
once, here, for both.

Contract:
- served = the sum of ``allocatable`` over the GPUNode's devices of that
  resource name (kubelet lists only healthy devices; an mdev parent serves
  several). A missing or stale report is unknown: it serves nothing to new
  binds, and it is never a reason to move what is already held there.
- free = served - units of Bound devices on the node - raw-name pod usage on
  the node not covered by the capacity coverage reader (R-MOD-6). Free can
  be negative: that is capacity lost (R-BIND-5).
- the launcher window: what a pod that claims to be a VMI's launcher uses
  before ``activePods`` proves it (``coverage.window_covering``) is kept
  apart. It is not in ``free`` (it moves and loses no hold) but it is in
  ``room`` (no new booking takes it); once the window closes it is raw use.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timedelta

from cozygpu.model import refusals
from cozygpu.model.refusals import Refusal
from cozygpu.model.snapshot import NodeCapacity, NodeInventory

#: How old an agent report may be before the node's GPUs read as unknown.
DEFAULT_REPORT_STALE_AFTER = timedelta(minutes=5)
#: How long a pod that claims to be a VMI's launcher may stay unproven before its GPUs count as raw use
#: that can take a hold's units (R-MOD-7; docs/model.md says how this default was chosen).
DEFAULT_LAUNCHER_GRACE = timedelta(seconds=30)


def served_units(devices: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Sum ``allocatable`` per resource name over a GPUNode's ``(resourceName, allocatable)`` entries."""
    served: dict[str, int] = {}
    for name, allocatable in devices:
        if name and allocatable > 0:
            served[name] = served.get(name, 0) + allocatable
    return served


def report_fresh(last_report: datetime | None, *, now: datetime, stale_after: timedelta) -> bool:
    """A report with no time, or older than ``stale_after``, is not fresh (unknown, never free)."""
    return last_report is not None and now - last_report <= stale_after


def node_capacity(
    node: str,
    *,
    inventory: NodeInventory | None,
    held: Mapping[str, int],
    raw_in_use: Mapping[str, int],
    window: Mapping[str, int] | None = None,
    dra: Mapping[str, int] | None = None,
    dra_names: Collection[str] = (),
) -> dict[str, NodeCapacity]:
    """The node's capacity for every resource name it serves, holds, or has raw or window usage of.

    ``dra`` is what DRA-sourced offers serve here (their resource name -> free devices of the node's
    slices, SPEC §1.5): published by the driver, not reported by the agent, so never stale; it stands for
    that name whatever the node's report says. ``dra_names`` are the names DRA offers sell: one absent
    from ``dra`` serves nothing here, and that is as fresh (a held GPU its driver tainted or withdrew is
    capacity lost, R-BIND-5).
    """
    served = inventory.served if inventory is not None else {}
    fresh = inventory is not None and inventory.fresh
    window = window or {}
    dra = dra or {}
    names = set(served) | set(held) | set(raw_in_use) | set(window) | set(dra)
    return {
        name: NodeCapacity(
            node=node,
            resource_name=name,
            served=dra.get(name, 0) if name in dra or name in dra_names else served.get(name, 0),
            held=held.get(name, 0),
            raw_in_use=raw_in_use.get(name, 0),
            fresh=fresh or name in dra or name in dra_names,
            window=window.get(name, 0),
        )
        for name in names
    }


def free_for_binds(capacity: NodeCapacity | None) -> int:
    """Units new binds may take: zero on an unknown (stale) report, never negative, never a window's."""
    if capacity is None or not capacity.fresh:
        return 0
    return max(capacity.room, 0)


def capacity_problem(capacity: NodeCapacity) -> Refusal | None:
    """Capacity lost: a fresh report serves fewer units than are held and used (an unknown one never is)."""
    if not capacity.fresh or capacity.free >= 0:
        return None
    return refusals.capacity_lost(
        capacity.node,
        resource_name=capacity.resource_name,
        served=capacity.served,
        in_use=capacity.held + capacity.raw_in_use,
    )
