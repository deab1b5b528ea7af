"""One placement cycle over only the sets whose inputs changed since the last (kube-scheduler's cycle over
its queue, here over the read model's change log); pure.

``plan_cycle`` is the plan over the whole snapshot, action for action, but for the repeated reasons of
orders left out (``tests/binder/test_cycle_view.py`` holds it so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from cozygpu.model.placement import Bind, KeepPending, PassPlan, Stay, plan_pass
from cozygpu.model.snapshot import DeviceKey, Snapshot, VmiKey

#: ``Snapshot.unsettled_by_name``'s key for the orders of a class without a resource name.
NO_RESOURCE_NAME: Final = ""


def _with_whole_sets(snapshot: Snapshot, keep: set[DeviceKey]) -> Snapshot:
    """``snapshot`` with only the devices of ``keep``, each with its whole set (its VMI's members), and every
    set held on a node over its capacity, where the capacity-lost rule weighs them all; units, budgets and
    availability stay the whole snapshot's."""
    devices = snapshot.devices
    for node in snapshot.over_capacity:  # kept by the model as capacities change: no walk over the fleet
        keep.update(snapshot.devices_by_node.get(node, ()))
    by_vmi: dict[VmiKey, tuple[DeviceKey, ...]] = {}
    for key in list(keep):
        device = devices[key]
        if device.attachment is not None:
            vmi = (device.namespace, device.attachment.vmi)
            if vmi not in by_vmi:
                by_vmi[vmi] = snapshot.devices_by_vmi.get(vmi, (key,))
                keep.update(by_vmi[vmi])
    return attrs.evolve(snapshot, devices={k: devices[k] for k in keep}, devices_by_vmi=by_vmi,
                        every_device=snapshot.devices)


@attrs.frozen
class Planned:
    """What a placement cycle planned on: its whole snapshot, the devices its plan acted on, and the reason
    each order still Pending or Lost was last kept so (that cycle's, or carried from an earlier one)."""

    snapshot: Snapshot
    acted: frozenset[DeviceKey]
    kept: Mapping[DeviceKey, KeepPending] = attrs.field(factory=dict)

    @classmethod
    def of(cls, snapshot: Snapshot, view: Snapshot, plan: PassPlan, last: Planned | None = None) -> Planned:
        """``acted``: every device the plan decided something for, except an order kept Pending for the
        very reason the last cycle gave (a repeat changes nothing, so it is no reason to judge it again).
        ``view``: what the plan was made on (a set in it that the plan keeps for no reason has none)."""
        before = last.kept if last is not None else {}
        if view is snapshot:
            kept: dict[DeviceKey, KeepPending] = {}
        else:
            kept = {k: v for k, v in before.items() if k in snapshot.unsettled and k not in view.devices}
        acted: set[DeviceKey] = set()
        for action in plan.actions:
            if isinstance(action, Stay):
                acted.update(action.devices)
                continue
            if isinstance(action, KeepPending):
                kept[action.device] = action
                if before.get(action.device) == action:
                    continue
            acted.add(action.device)
        return cls(snapshot, frozenset(acted), kept)


def cycle_view(snapshot: Snapshot, last: Planned | None, *, unsettled: bool = False) -> Snapshot:
    """``snapshot`` with only the sets a placement cycle could decide anything new for, given the last cycle.

    A set is left out only when the last cycle's plan did nothing new for it
    and nothing it is judged on changed since. A Bound set that kept its
    node (no Bind, MarkLost, Stay or answer among its members) is judged on
    its members' views, its VMI's view and its launchers' pods, and its
    node's view, report and capacity; left out, it keeps its node again —
    the keep rule reads only those — and plans nothing. A Pending or Lost
    set that was kept so for a reason is judged, besides its own views, on
    the room for its resource name and on the tenants' usage: while neither
    moved (``Changes.names``, ``Changes.usage``) it would be kept for the
    very same reason, so it is left out (``unsettled``: never). A set with
    a bind request not answered yet is always in. What other sets are
    decided against (free units, budgets, availability) stays the whole
    snapshot's, and every set on a node over its capacity is in, where the
    capacity-lost rule weighs them all. So the plan on the view is the plan
    on the whole snapshot, action for action, but for the repeated reasons
    of orders left out (``plan_cycle``; ``tests/binder/test_cycle_view.py``).
    What changed is the model's change log (``Snapshot.changes_since``): it
    costs what changed, not the fleet. A rebuild of the model since (a
    class, what KubeVirt permits or the resource names in effect changed, a
    store was replaced), or no last cycle, plans everything.
    """
    if last is None:
        return snapshot
    changes = snapshot.changes_since(last.snapshot)
    if changes is None:
        return snapshot
    devices = snapshot.devices
    keep: set[DeviceKey] = set(snapshot.asking)
    if unsettled or changes.usage:
        keep.update(snapshot.unsettled)
    else:
        by_name = snapshot.unsettled_by_name
        keep.update(by_name.get(NO_RESOURCE_NAME, ()))
        for name in changes.names:
            keep.update(by_name.get(name, ()))
    keep.update(k for k in last.acted if k in devices)
    keep.update(k for k in changes.devices if k in devices)
    for node in changes.nodes:
        keep.update(snapshot.devices_by_node.get(node, ()))
    for vmi in changes.vmis:
        keep.update(snapshot.devices_by_vmi.get(vmi, ()))
    return _with_whole_sets(snapshot, keep)


def plan_cycle(snapshot: Snapshot, last: Planned | None) -> tuple[Snapshot, PassPlan]:
    """One placement cycle's view and plan (R-BIND-5 over the sets whose inputs changed).

    An order left out of the view would have been kept for last cycle's
    reason — unless this cycle books units ahead of it: then its reason may
    now name other numbers, so when the plan binds anything while some
    Pending or Lost order was left out, the cycle plans again with every
    one of them in.
    """
    view = cycle_view(snapshot, last)
    plan = plan_pass(view)
    if view is snapshot or not any(isinstance(a, Bind) for a in plan.actions):
        return view, plan
    if all(k in view.devices for k in snapshot.unsettled):
        return view, plan
    view = cycle_view(snapshot, last, unsettled=True)
    return view, plan_pass(view)
