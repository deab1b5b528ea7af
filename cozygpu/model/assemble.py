"""Assemble a Snapshot from typed views: derive the effective names, budgets and every index once.

Why: every question the model answers (a catalog entry, an order check, a
placement) reads the same derived tables; computing them per question would
make the catalog O(all devices). Callers convert their cache into views
(``cozygpu.cache.snapshot`` does it for the informer cache) and call
:func:`assemble`; tests call it with hand-made views.

Contract: pure; ``now`` is passed in and decides which agent reports are
fresh. Order of derivation: report freshness -> effective names (R-MOD-9)
-> budgets (R-MOD-2/3) -> device indexes -> launchers (R-MOD-5) -> pod
usage split by the two coverage readers (R-MOD-6) -> subtree usage
(R-MOD-4) -> node capacity (R-MOD-7) -> per-class availability over
eligible nodes (R-MOD-8, R-MOD-12).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import attrs

from cozygpu.model import capacity as cap
from cozygpu.model.budgets import read_budgets
from cozygpu.model.coverage import (
    attached_to,
    budget_covering,
    capacity_covering,
    covered_units,
    uncovered,
)
from cozygpu.model.eligibility import node_problem
from cozygpu.model.launchers import launcher_index, launcher_vmi
from cozygpu.model.resource_names import effective_names as derive_effective_names
from cozygpu.model.snapshot import (
    ClassAvailability,
    DeviceKey,
    DeviceView,
    GPUClassView,
    NamespaceView,
    NodeCapacity,
    NodeInventory,
    NodeView,
    PermittedHostDevices,
    Phase,
    PodView,
    Snapshot,
    TenantBudgets,
    Usage,
    VmiKey,
    VMIView,
)
from cozygpu.model.tenants import is_tenant_namespace, parent_namespace


def assemble(
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
) -> Snapshot:
    """Build a Snapshot. ``quotas`` maps a tenant namespace to its ``tenant-quota`` ``spec.hard``."""
    class_map = {c.name: c for c in classes}
    node_map = {n.name: n for n in nodes}
    inventory_map: dict[str, NodeInventory] = {}
    for inventory in inventories:
        fresh = cap.report_fresh(inventory.last_report, now=now, stale_after=report_stale_after)
        inventory_map[inventory.name] = inventory if inventory.fresh == fresh else attrs.evolve(inventory, fresh=fresh)
    vmi_map = {v.key: v for v in vmis}
    namespace_map = {n.name: n for n in namespaces}

    names = derive_effective_names(
        hoster=hoster_names, classes=class_map.values(), inventories=inventory_map.values(), permitted=permitted
    )
    budgets: dict[str, TenantBudgets] = {}
    for namespace, hard in (quotas or {}).items():
        if is_tenant_namespace(namespace):
            budgets[namespace] = read_budgets(namespace, hard, names)

    device_map: dict[DeviceKey, DeviceView] = {}
    by_node: defaultdict[str, list[DeviceKey]] = defaultdict(list)
    by_class: defaultdict[str, list[DeviceKey]] = defaultdict(list)
    by_namespace: defaultdict[str, list[DeviceKey]] = defaultdict(list)
    by_vmi: defaultdict[VmiKey, list[DeviceKey]] = defaultdict(list)
    local_class: defaultdict[str, dict[str, int]] = defaultdict(dict)
    local_raw: defaultdict[str, dict[str, int]] = defaultdict(dict)
    # Orders not yet accepted: they count for the admission check only (R-MOD-4).
    pending_class: defaultdict[str, dict[str, int]] = defaultdict(dict)
    pending_raw: defaultdict[str, dict[str, int]] = defaultdict(dict)
    held: defaultdict[str, dict[str, int]] = defaultdict(dict)
    bound, pending = Phase.BOUND, Phase.PENDING
    resource_of = {name: c.resource_name for name, c in class_map.items()}
    # The hottest loop of a build (every device): plain locals, no properties.
    for device in devices:
        namespace, class_name, node_name, count = device.namespace, device.class_name, device.node_name, device.count
        key = (namespace, device.name)
        device_map[key] = device
        by_class[class_name].append(key)
        by_namespace[namespace].append(key)
        if device.attachment is not None:
            by_vmi[(namespace, device.attachment.vmi)].append(key)
        resource = resource_of.get(class_name)
        phase = device.phase
        if node_name:
            by_node[node_name].append(key)
            if phase is bound and resource is not None:
                per_name = held[node_name]
                per_name[resource] = per_name.get(resource, 0) + count
        if phase is not pending:
            counts, raws = local_class[namespace], local_raw[namespace]
        elif not device.deleting:
            counts, raws = pending_class[namespace], pending_raw[namespace]
        else:
            continue
        counts[class_name] = counts.get(class_name, 0) + count
        if resource is not None:
            raws[resource] = raws.get(resource, 0) + count

    launchers = launcher_index(vmi_map.values())
    pod_map: dict[str, PodView] = {}
    raw_on_node: defaultdict[str, dict[str, int]] = defaultdict(dict)
    for pod in pods:
        pod_map[pod.uid] = pod
        if pod.final:
            continue
        requests = {n: v for n, v in pod.requests.items() if n in names}
        if not requests:
            continue
        attached: tuple[DeviceView, ...] = ()
        vmi_key = launcher_vmi(pod, launchers)
        vmi = vmi_map.get(vmi_key) if vmi_key is not None else None
        if vmi is not None:
            attached = tuple(d for d in (device_map[k] for k in by_vmi.get(vmi.key, ())) if attached_to(d, vmi))
        budget_cover = budget_covering(attached)
        beyond_budget = uncovered(requests, covered_units(budget_cover, class_map))
        for name, n in beyond_budget.items():
            raw = local_raw[pod.namespace]
            raw[name] = raw.get(name, 0) + n
        if pod.node_name:
            covering = capacity_covering(attached, pod_node=pod.node_name)
            beyond = beyond_budget  # usually the same devices cover (all Bound on the pod's node)
            if covering != budget_cover:
                beyond = uncovered(requests, covered_units(covering, class_map))
            for name, n in beyond.items():
                on_node = raw_on_node[pod.node_name]
                on_node[name] = on_node.get(name, 0) + n

    subtree = _subtree_usage(local_class, local_raw)
    pending_subtree = _subtree_usage(pending_class, pending_raw)
    children: defaultdict[str, list[str]] = defaultdict(list)
    for namespace in set(namespace_map) | set(by_namespace) | set(budgets):
        parent = parent_namespace(namespace)
        if parent is not None:
            children[parent].append(namespace)

    capacity: dict[str, dict[str, NodeCapacity]] = {}
    for node in set(inventory_map) | set(held) | set(raw_on_node):
        capacity[node] = cap.node_capacity(
            node, inventory=inventory_map.get(node), held=held.get(node, {}), raw_in_use=raw_on_node.get(node, {})
        )
    serving: defaultdict[str, list[str]] = defaultdict(list)
    for node, node_entries in capacity.items():
        for name, entry in node_entries.items():
            if entry.fresh and entry.served > 0:
                serving[name].append(node)
    serving_sorted = {name: tuple(sorted(nodes_)) for name, nodes_ in serving.items()}

    availability = {
        c.name: _availability(c, serving_sorted.get(c.resource_name, ()), node_map, capacity)
        for c in class_map.values()
    }
    return Snapshot(
        now=now,
        classes=class_map,
        devices=device_map,
        nodes=node_map,
        inventories=inventory_map,
        pods=pod_map,
        vmis=vmi_map,
        namespaces=namespace_map,
        budgets=budgets,
        effective_names=names,
        permitted=permitted,
        devices_by_node={k: tuple(v) for k, v in by_node.items()},
        devices_by_class={k: tuple(v) for k, v in by_class.items()},
        devices_by_namespace={k: tuple(v) for k, v in by_namespace.items()},
        devices_by_vmi={k: tuple(v) for k, v in by_vmi.items()},
        launchers=launchers,
        children={k: tuple(sorted(v)) for k, v in children.items()},
        subtree_usage=subtree,
        pending_usage=pending_subtree,
        capacity=capacity,
        availability=availability,
        serving=serving_sorted,
    )


def _subtree_usage(
    local_class: Mapping[str, Mapping[str, int]], local_raw: Mapping[str, Mapping[str, int]]
) -> dict[str, Usage]:
    """Add each tenant namespace's own usage to itself and every ancestor.

    Bottom up, one merge per tenant rather than one per (namespace, ancestor):
    each tenant starts from its own usage (its ancestors from none) and is
    then added to its parent, children before parents.
    """
    per_class: dict[str, dict[str, int]] = {}
    raw: dict[str, dict[str, int]] = {}
    for namespace in set(local_class) | set(local_raw):
        if is_tenant_namespace(namespace):
            per_class[namespace] = dict(local_class.get(namespace, {}))
            raw[namespace] = dict(local_raw.get(namespace, {}))
    parents: dict[str, str] = {}
    unvisited = list(per_class)
    while unvisited:
        tenant = unvisited.pop()
        parent = parent_namespace(tenant)
        if parent is not None:
            parents[tenant] = parent
            if parent not in per_class:
                per_class[parent], raw[parent] = {}, {}
                unvisited.append(parent)
    # Longest names first is children first: a child is named after its parent
    # plus "-<segment>". (Children of tenant-root may be shorter than it, but
    # tenant-root has no parent to be added to, so it never has to wait.)
    for tenant in sorted(parents, key=len, reverse=True):
        parent = parents[tenant]
        for into, own in ((per_class[parent], per_class[tenant]), (raw[parent], raw[tenant])):
            for name, n in own.items():
                into[name] = into.get(name, 0) + n
    return {
        tenant: Usage(per_class=counts, total=sum(counts.values()), raw=raw[tenant])
        for tenant, counts in per_class.items()
    }


def _availability(
    gpu_class: GPUClassView,
    serving: tuple[str, ...],
    nodes: Mapping[str, NodeView],
    capacity: Mapping[str, Mapping[str, NodeCapacity]],
) -> ClassAvailability:
    node_free: dict[str, int] = {}
    best_node: str | None = None
    best = 0
    total = 0
    for node_name in serving:
        if node_problem(
            nodes.get(node_name),
            node_name=node_name,
            tolerations=gpu_class.tolerations,
            selector=gpu_class.node_selector,
        ):
            continue
        free = cap.free_for_binds(capacity[node_name].get(gpu_class.resource_name))
        node_free[node_name] = free
        total += free
        if free > best:
            best, best_node = free, node_name
    return ClassAvailability(
        class_name=gpu_class.name,
        node_free=node_free,
        free_in_cluster=total,
        free_on_best_node=best,
        best_node=best_node,
    )
