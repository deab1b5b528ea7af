"""What the binder reports on GPUClasses and GPUNodes (R-BIND-10): pure status, written only when it changed.

Contract:
- **GPUClass** ``status``: ``units`` (what the class's eligible nodes serve
  with a fresh report: the class's nodeSelector and tolerations only, as
  R-MOD-12 counts availability), ``held`` (units of the class's Bound
  devices, wherever they are), ``free`` (free units on those nodes) and the
  ``Available`` condition: True with the best node and its free units, or
  False with why (no eligible node serves the resource name; all units are
  held; the class is being deleted). A DRA-sourced class also gets
  ``OfferPublished``: True while every device its offer matches is sold,
  False with what keeps some out (its DeviceClass gone, a pool incomplete,
  a device tainted or unreadable, another class's offer of its name used).
- **GPUNode** conditions: ``Eligible`` (the Node exists, is Ready, is not
  cordoned and the agent's report is fresh; else False with the first
  problem) and ``CapacityExceeded`` (False while every resource name holds
  at most what it serves; True with the numbers — served, held by Bound
  devices, in use by other pods — for each one that holds more).
- A condition keeps its ``lastTransitionTime`` while its status is
  unchanged. Nothing is written when the status would not change.
- Writes are merge patches of the status subresource on the resourceVersion
  the report was made from; a Conflict or a vanished object is left to the
  next pass. A GPUNode's patch names only ``conditions``, so the agent's
  fields are never touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import attrs

from cozygpu import keys
from cozygpu.api import conditions, meta
from cozygpu.api.conditions import Condition, comparable, merge
from cozygpu.binder.patcher import OnRefusal, Write
from cozygpu.kube import resource_path
from cozygpu.model import capacity as cap
from cozygpu.model.snapshot import Changes, GPUClassView, NodeCapacity, Snapshot
from cozygpu.views import specs

Obj = Mapping[str, Any]

AVAILABLE: Final = "Available"
ELIGIBLE: Final = "Eligible"
CAPACITY_EXCEEDED: Final = "CapacityExceeded"
OFFER_PUBLISHED: Final = "OfferPublished"


def _units(n: int) -> str:
    return f"{n} unit" if n == 1 else f"{n} units"


def class_status(snapshot: Snapshot, gpu_class: GPUClassView) -> dict[str, Any]:
    """The status fields of one class (conditions without transition times)."""
    fields, available = class_report(snapshot, gpu_class)
    return {**fields, "conditions": [c.as_json() for c in (available, *offer_report(snapshot, gpu_class))]}


def offer_report(snapshot: Snapshot, gpu_class: GPUClassView) -> tuple[Condition, ...]:
    """A DRA-sourced class's ``OfferPublished`` condition (none for a device-plugin class)."""
    if gpu_class.dra is None:
        return ()
    problems = snapshot.dra_problems.get(gpu_class.name, ())
    if not problems:
        return (Condition(OFFER_PUBLISHED, True, "Published",
                          f"every device of DeviceClass {gpu_class.dra.device_class} the offer matches is sold"),)
    return (Condition(OFFER_PUBLISHED, False, "DevicesLeftOut", "; ".join(problems)),)


def class_report(snapshot: Snapshot, gpu_class: GPUClassView) -> tuple[dict[str, Any], Condition]:
    """The status fields of one class but its conditions, and its ``Available`` condition."""
    availability = snapshot.availability.get(gpu_class.name)
    node_free = availability.node_free if availability is not None else {}
    units = availability.served_in_cluster if availability is not None else 0  # kept by the model: no walks
    held = snapshot.held_by_class.get(gpu_class.name, 0)
    free = availability.free_in_cluster if availability is not None else 0
    if gpu_class.deleting:
        condition = Condition(AVAILABLE, False, "Deleting", "the class is being deleted: no new orders")
    elif not node_free and gpu_class.dra is not None:
        condition = Condition(AVAILABLE, False, "NoEligibleNode",
                               f"no Ready, eligible node has devices of DeviceClass {gpu_class.dra.device_class} "
                               "published that the offer matches")
    elif not node_free:
        condition = Condition(AVAILABLE, False, "NoEligibleNode",
                               f"no Ready, eligible node with a fresh report serves {gpu_class.resource_name}")
    elif free == 0:
        condition = Condition(AVAILABLE, False, "AllHeld",
                               f"all {_units(units)} on {len(node_free)} eligible node(s) are held or in use")
    else:
        assert availability is not None
        condition = Condition(AVAILABLE, True, "UnitsFree",
                               f"{_units(free)} free on {len(node_free)} eligible node(s); the most on node "
                               f"{availability.best_node} ({availability.free_on_best_node})")
    return {"units": units, "held": held, "free": free}, condition


def _exceeded(entries: Iterable[NodeCapacity]) -> list[str]:
    return [f"{c.resource_name}: serves {c.served}, {c.held} held by Bound devices, {c.raw_in_use} in use by "
            f"other pods" for c in sorted(entries, key=lambda c: c.resource_name) if cap.capacity_problem(c)]


def node_conditions(snapshot: Snapshot, name: str) -> list[dict[str, Any]]:
    """The binder's two conditions on GPUNode ``name``, as written (transition times aside)."""
    return [c.as_json() for c in node_report(snapshot, name)]


def node_report(snapshot: Snapshot, name: str) -> list[Condition]:
    node = snapshot.nodes.get(name)
    inventory = snapshot.inventories.get(name)
    if node is None:
        eligible = Condition(ELIGIBLE, False, "NodeGone", f"the Node {name} does not exist")
    elif not node.ready:
        eligible = Condition(ELIGIBLE, False, "NodeNotReady", f"the Node {name} is not Ready")
    elif node.unschedulable:
        eligible = Condition(ELIGIBLE, False, "NodeCordoned", f"the Node {name} is cordoned: held sets move off "
                              "where another node has room, new orders go elsewhere")
    elif inventory is None or not inventory.fresh:
        eligible = Condition(ELIGIBLE, False, "ReportStale", "the agent's report is missing or stale: its units "
                              "are unknown and never free")
    else:
        served = ", ".join(f"{n}={u}" for n, u in sorted(inventory.served.items())) or "nothing"
        eligible = Condition(ELIGIBLE, True, "Eligible", f"serves {served}")
    entries = snapshot.capacity.get(name, {}).values()
    over = _exceeded(entries)
    if over:
        exceeded = Condition(CAPACITY_EXCEEDED, True, "CapacityLost", "; ".join(over))
    else:
        shown = ", ".join(f"{c.resource_name}: {c.held} of {c.served} held"
                          for c in sorted(entries, key=lambda c: c.resource_name)) or "nothing held"
        exceeded = Condition(CAPACITY_EXCEEDED, False, "WithinCapacity", shown)
    return [eligible, exceeded]


@attrs.frozen(kw_only=True)
class StatusWrite:
    kind: str
    name: str
    path: str
    resource_version: str
    status: Mapping[str, Any]
    what: str


def _write_if_changed(obj: Obj, kind: str, path: str, fields: Mapping[str, Any], wanted: Sequence[Condition],
                      now: datetime, what: str) -> StatusWrite | None:
    """The status write of ``fields`` and the ``wanted`` conditions (the object's others kept), if it changes
    anything; no ``observedGeneration``: a report is of the world, not of the object's spec."""
    current = meta.status(obj)
    have = conditions.of(obj)
    merged = merge(have, wanted, now)
    if all(current.get(k) == v for k, v in fields.items()) and comparable(merged) == comparable(have):
        return None
    return StatusWrite(kind=kind, name=meta.name(obj), path=path, resource_version=meta.resource_version(obj),
                       status={**fields, "conditions": merged}, what=what)


#: What the reports work looks at: ``(kind, name)`` of a GPUClass or a GPUNode.
Key = tuple[str, str]


def keys_changed(snapshot: Snapshot, changes: Changes | None) -> list[Key]:
    """The reports the model's change log ``changes`` may have moved (None: every one): each GPUNode it
    names, and each class of a resource name whose availability or room it names."""
    if changes is None:
        return [*((keys.GPUCLASS_KIND, name) for name in sorted(snapshot.classes)),
                *((keys.GPUNODE_KIND, name) for name in sorted(set(snapshot.inventories) | set(snapshot.nodes)))]
    names = changes.names
    return [*((keys.GPUCLASS_KIND, c.name) for c in sorted(snapshot.classes.values(), key=lambda c: c.name)
              if c.resource_name in names),
            *((keys.GPUNODE_KIND, name) for name in sorted(changes.nodes))]


def class_write(snapshot: Snapshot, obj: Obj, now: datetime) -> StatusWrite | None:
    """The status write that brings GPUClass ``obj``'s report up to date (None: it is, or unreadable)."""
    name = meta.name(obj)
    view = snapshot.classes.get(name)
    if view is None:
        return None  # unreadable: the snapshot left it out and logged why
    path = resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL, name=name, subresource="status")
    fields, available = class_report(snapshot, view)
    return _write_if_changed(obj, keys.GPUCLASS_KIND, path, fields, [available, *offer_report(snapshot, view)], now,
                             f"GPUClass {name}")


def node_write(snapshot: Snapshot, obj: Obj, now: datetime) -> StatusWrite | None:
    """The status write that brings GPUNode ``obj``'s conditions up to date (None: they are)."""
    name = meta.name(obj)
    path = resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL, name=name, subresource="status")
    return _write_if_changed(obj, keys.GPUNODE_KIND, path, {}, node_report(snapshot, name), now, f"GPUNode {name}")


def report_writes(snapshot: Snapshot, classes: Iterable[Obj], gpunodes: Iterable[Obj], *,
                  now: datetime) -> tuple[StatusWrite, ...]:
    """The status writes that bring every GPUClass and GPUNode report up to date."""
    found = [*(class_write(snapshot, obj, now) for obj in classes),
             *(node_write(snapshot, obj, now) for obj in gpunodes)]
    return tuple(write for write in found if write is not None)


def report_sends(writes: Iterable[StatusWrite]) -> list[Write]:
    """The reports as the patcher's writes: a merge patch of the status on the version it was judged on;
    a refused one is let go (the change that beat it is itself an event, which asks for a pass)."""
    kinds = {keys.GPUCLASS_KIND: specs.GPU_CLASSES, keys.GPUNODE_KIND: specs.GPU_NODES}
    return [Write(kind=kinds[w.kind], path=w.path, body={"status": dict(w.status)}, resource_version=w.resource_version,
                  on_refusal=OnRefusal.IGNORE, what=w.what, tag=w) for w in writes]
