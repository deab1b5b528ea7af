"""The catalog view and the order check (R-MOD-12, R-ADM-1).

Why: the dashboard's option source shows, per class, what a tenant can
order; the GPUDevice webhook refuses what cannot be met now; the binder
re-checks. They read the same entry, so what the catalog shows is what the
webhook checks against.

Contract:
- :func:`catalog_entry` answers, for one namespace and class: free units in
  the cluster and on the best single node (over nodes eligible for the
  class), remaining budget (the tightest class, total and raw key up the
  ancestry; None when no budget applies), maxCount, entitlement, and the
  refusals that refuse every order size: ``class_refusal`` (deleting class,
  class not permitted by KubeVirt, no entitlement) and ``budget_refusal``
  (unreadable budget, raw-key block). It costs O(ancestry x keys), never
  O(devices). Budgets count the subtree's accepted devices **and** its
  orders not yet accepted (R-MOD-4: they count for the admission check).
- :func:`refusal_for` says why an order of N would be refused, in the
  binder's order (``placement._Planner.order_problem``), so the webhook and
  the binder tell the same story: the class, count and maxCount, budgets,
  free units in the cluster, free units on one node. None means it would be
  accepted now.
- :func:`order_refusal` is both in one call, for the webhook and the CLI.
"""

from __future__ import annotations

import attrs

from cozygpu.model import refusals
from cozygpu.model.budgets import BudgetLimit, class_budget
from cozygpu.model.classes import count_problem, entitled, entitlement_problem, max_count
from cozygpu.model.refusals import Refusal
from cozygpu.model.resource_names import class_permission_problem
from cozygpu.model.snapshot import GPUClassView, Mode, Snapshot


@attrs.frozen(kw_only=True)
class CatalogEntry:
    namespace: str
    class_name: str
    mode: Mode
    resource_name: str
    max_count: int | None
    entitled: bool
    free_in_cluster: int
    free_on_best_node: int
    best_node: str | None
    #: None: no budget applies to this class here.
    remaining_budget: int | None
    limiting_budget: BudgetLimit | None
    #: Why no order of this class can be accepted here, whatever its size: the class itself.
    class_refusal: Refusal | None
    #: ... or a budget that refuses every order (unreadable, raw-key block).
    budget_refusal: Refusal | None
    #: Orderable now: the largest N that :func:`refusal_for` accepts (0 when none).
    orderable: int

    @property
    def blocked(self) -> Refusal | None:
        """A refusal that applies to every order size."""
        return self.class_refusal or self.budget_refusal


def class_problem(snapshot: Snapshot, namespace: str, gpu_class: GPUClassView) -> Refusal | None:
    """Refusals independent of the order size and of budgets: deleting, not permitted, not entitled."""
    if gpu_class.deleting:
        return refusals.class_deleting(gpu_class.name)
    permission = class_permission_problem(gpu_class, snapshot.permitted)
    if permission is not None:
        return permission
    return entitlement_problem(gpu_class, namespace, snapshot.namespaces)


def catalog_entry(snapshot: Snapshot, namespace: str, gpu_class: GPUClassView) -> CatalogEntry:
    available = snapshot.availability.get(gpu_class.name)
    budget = class_budget(snapshot, namespace, gpu_class, extra=snapshot.pending_usage)
    class_refusal = class_problem(snapshot, namespace, gpu_class)
    blocked = class_refusal or budget.refusal
    limit = max_count(gpu_class)
    free_cluster = available.free_in_cluster if available else 0
    free_node = available.free_on_best_node if available else 0
    orderable = 0
    if blocked is None:
        caps = [free_cluster, free_node]
        if limit is not None:
            caps.append(limit)
        if budget.remaining is not None:
            caps.append(budget.remaining)
        orderable = max(min(caps), 0)
    return CatalogEntry(
        namespace=namespace,
        class_name=gpu_class.name,
        mode=gpu_class.mode,
        resource_name=gpu_class.resource_name,
        max_count=limit,
        entitled=entitled(namespace, snapshot.namespaces),
        free_in_cluster=free_cluster,
        free_on_best_node=free_node,
        best_node=available.best_node if available else None,
        remaining_budget=budget.remaining,
        limiting_budget=budget.limiting,
        class_refusal=class_refusal,
        budget_refusal=budget.refusal,
        orderable=orderable,
    )


def catalog(snapshot: Snapshot, namespace: str) -> tuple[CatalogEntry, ...]:
    """Every class as seen from one namespace, sorted by class name."""
    return tuple(catalog_entry(snapshot, namespace, snapshot.classes[name]) for name in sorted(snapshot.classes))


def refusal_for(entry: CatalogEntry, count: int, *, gpu_class: GPUClassView) -> Refusal | None:
    """Why an order of ``count`` GPUs would be refused, from a catalog entry; None when it fits."""
    if entry.class_refusal is not None:
        return entry.class_refusal
    problem = count_problem(gpu_class, count)
    if problem is not None:
        return problem
    if entry.budget_refusal is not None:
        return entry.budget_refusal
    limiting = entry.limiting_budget
    if limiting is not None and entry.remaining_budget is not None and count > entry.remaining_budget:
        return refusals.budget_exceeded(
            key=limiting.key, namespace=limiting.namespace, limit=limiting.limit, in_use=limiting.used, requested=count
        )
    if count > entry.free_in_cluster:
        return refusals.no_free_units(entry.class_name, free=entry.free_in_cluster, requested=count)
    if count > entry.free_on_best_node:
        return refusals.no_node_with_room(
            entry.class_name, best_free=entry.free_on_best_node, best_node=entry.best_node, requested=count,
            together=gpu_class.dra.match_attribute if gpu_class.dra is not None else "",
        )
    return None


def order_refusal(snapshot: Snapshot, namespace: str, class_name: str, count: int) -> Refusal | None:
    """The GPUDevice admission check (R-ADM-1): why this order cannot be met now, or None."""
    gpu_class = snapshot.classes.get(class_name)
    if gpu_class is None:
        return refusals.unknown_class(class_name)
    return refusal_for(catalog_entry(snapshot, namespace, gpu_class), count, gpu_class=gpu_class)
