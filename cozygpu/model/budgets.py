"""GPU budgets over a tenant's whole subtree (R-MOD-2) and raw keys (R-MOD-3).

Why: a tenant declares GPU budgets in its ``resourceQuotas``; the tenant
chart renders them into ResourceQuota ``tenant-quota``. Kubernetes quota
knows nothing of GPUDevices or of subtrees, so we enforce these budgets
ourselves, independent of Cozystack's tenant quota pools.

Contract:
- Keys are read from ``tenant-quota``'s ``spec.hard`` as ``requests.<key>``;
  the bare ``<key>`` is accepted too, and when both are present the smaller
  counts. ``limits.<key>`` is ignored.
- ``gpu.cozystack.io/<class>`` caps one class, ``gpu.cozystack.io/total``
  every class together; both over the declaring tenant's whole subtree.
- A raw key is ``requests.<name>`` for a name in the effective GPU set. It
  blocks every class with that resourceName for the declaring tenant's
  subtree until the same tenant also declares a ``gpu.cozystack.io`` key;
  from then on it caps devices of those classes and raw-name pods together.
- A budget that cannot be read (not a quantity, or not a whole number of
  GPUs) refuses every order under it; it is never skipped.
- An order must fit every budget of its tenant and of every ancestor. The
  remaining budget is the tightest of them; on a tie the nearest tenant
  wins, and a class key before the total before a raw key.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from cozygpu import keys
from cozygpu.model import refusals
from cozygpu.model.quantities import QuantityError, whole_units
from cozygpu.model.refusals import Refusal
from cozygpu.model.snapshot import EMPTY_USAGE, BudgetValue, GPUClassView, Snapshot, TenantBudgets, Usage
from cozygpu.model.tenants import ancestry

REQUESTS_PREFIX = "requests."


def _value(key: str, text: object) -> BudgetValue:
    try:
        return BudgetValue(key=key, text=str(text), amount=whole_units(text))
    except QuantityError as error:
        return BudgetValue(key=key, text=str(text), amount=None, problem=str(error))


def _tighter(a: BudgetValue | None, b: BudgetValue) -> BudgetValue:
    if a is None:
        return b
    if a.amount is None:
        return a
    if b.amount is None or b.amount < a.amount:
        return b
    return a


def read_budgets(namespace: str, hard: Mapping[str, object], effective_names: frozenset[str]) -> TenantBudgets:
    """The GPU budgets one tenant declares, from its ``tenant-quota`` ``spec.hard``."""
    per_class: dict[str, BudgetValue] = {}
    total: BudgetValue | None = None
    raw: dict[str, BudgetValue] = {}
    for quota_key, text in hard.items():
        prefixed = quota_key.startswith(REQUESTS_PREFIX)
        key = quota_key[len(REQUESTS_PREFIX) :] if prefixed else quota_key
        if key.startswith(keys.QUOTA_PREFIX):
            value = _value(key, text)
            if key == keys.QUOTA_TOTAL:
                total = _tighter(total, value)
            else:
                class_name = key[len(keys.QUOTA_PREFIX) :]
                per_class[class_name] = _tighter(per_class.get(class_name), value)
        elif prefixed and key in effective_names:
            raw[key] = _tighter(raw.get(key), _value(quota_key, text))
    return TenantBudgets(namespace=namespace, per_class=per_class, total=total, raw=raw)


@attrs.frozen(kw_only=True)
class BudgetLimit:
    """One budget that applies to an order, and what its subtree already uses."""

    namespace: str
    key: str
    limit: int
    used: int

    @property
    def remaining(self) -> int:
        return max(self.limit - self.used, 0)


@attrs.frozen(kw_only=True)
class ClassBudget:
    """The budget view of one class for one namespace (R-MOD-12).

    ``remaining`` is None when no budget applies. ``refusal`` is set when a
    budget refuses any order regardless of its size (unreadable, raw block).
    """

    remaining: int | None
    limiting: BudgetLimit | None = None
    refusal: Refusal | None = None


def combined_usage(snapshot: Snapshot, namespace: str, extra: Mapping[str, Usage] | None) -> Usage:
    base = snapshot.usage_of(namespace)
    more = extra.get(namespace) if extra else None
    if more is None:
        return base
    return add_usage(base, more)


def add_usage(a: Usage, b: Usage) -> Usage:
    per_class = dict(a.per_class)
    for name, n in b.per_class.items():
        per_class[name] = per_class.get(name, 0) + n
    raw = dict(a.raw)
    for name, n in b.raw.items():
        raw[name] = raw.get(name, 0) + n
    return Usage(per_class=per_class, total=a.total + b.total, raw=raw)


def demand_usage(demand: Mapping[str, int], classes: Mapping[str, GPUClassView]) -> Usage:
    """The usage an order adds: per class, total, and per resource name of the classes."""
    raw: dict[str, int] = {}
    for class_name, count in demand.items():
        gpu_class = classes.get(class_name)
        if gpu_class is not None:
            raw[gpu_class.resource_name] = raw.get(gpu_class.resource_name, 0) + count
    return Usage(per_class=dict(demand), total=sum(demand.values()), raw=raw)


def _limits_for(
    snapshot: Snapshot,
    namespace: str,
    demand: Usage,
    extra: Mapping[str, Usage] | None,
) -> tuple[list[tuple[BudgetLimit, int]], Refusal | None]:
    """Every budget the demand falls under, with the demand's amount under it; or a blanket refusal."""
    found: list[tuple[BudgetLimit, int]] = []
    for tenant in ancestry(namespace):
        declared = snapshot.budgets.get(tenant)
        if declared is None:
            continue
        used = combined_usage(snapshot, tenant, extra)
        entries: list[tuple[BudgetValue, int, int]] = []
        for class_name, want in demand.per_class.items():
            value = declared.per_class.get(class_name)
            if value is not None:
                entries.append((value, used.per_class.get(class_name, 0), want))
        if declared.total is not None and demand.total:
            entries.append((declared.total, used.total, demand.total))
        for name, want in demand.raw.items():
            value = declared.raw.get(name)
            if value is None:
                continue
            if not declared.declares_gpu_key:
                blocked = sorted(c for c in demand.per_class if _resource(snapshot, c) == name)
                return found, refusals.raw_key_blocked(
                    key=value.key, namespace=tenant, class_name=", ".join(blocked) or "?", resource_name=name
                )
            entries.append((value, used.raw.get(name, 0), want))
        for value, in_use, want in entries:
            if value.amount is None:
                return found, refusals.budget_unreadable(
                    key=value.key, namespace=tenant, text=value.text, problem=value.problem
                )
            found.append((BudgetLimit(namespace=tenant, key=value.key, limit=value.amount, used=in_use), want))
    return found, None


def _resource(snapshot: Snapshot, class_name: str) -> str | None:
    gpu_class = snapshot.classes.get(class_name)
    return gpu_class.resource_name if gpu_class is not None else None


def class_budget(
    snapshot: Snapshot, namespace: str, gpu_class: GPUClassView, *, extra: Mapping[str, Usage] | None = None
) -> ClassBudget:
    """The remaining budget of one class for a namespace: the tightest limit up the ancestry."""
    probe = Usage(per_class={gpu_class.name: 1}, total=1, raw={gpu_class.resource_name: 1})
    limits, refusal = _limits_for(snapshot, namespace, probe, extra)
    if refusal is not None:
        return ClassBudget(remaining=0, refusal=refusal)
    if not limits:
        return ClassBudget(remaining=None)
    # Unclamped, so that when several budgets are already over, the one
    # named here is the one budget_refusal names for the same order.
    tightest = min((limit for limit, _ in limits), key=lambda limit: limit.limit - limit.used)
    return ClassBudget(remaining=tightest.remaining, limiting=tightest)


def budget_refusal(
    snapshot: Snapshot,
    namespace: str,
    demand: Mapping[str, int],
    *,
    extra: Mapping[str, Usage] | None = None,
) -> Refusal | None:
    """Why an order of ``demand`` (class -> GPUs) would break a budget up the ancestry; None if it fits.

    ``extra`` is usage not yet in the snapshot, per tenant subtree (a pass's
    earlier acceptances; see ``BudgetLedger``).
    """
    wanted = demand_usage({c: n for c, n in demand.items() if n > 0}, snapshot.classes)
    if not wanted.total:
        return None
    limits, refusal = _limits_for(snapshot, namespace, wanted, extra)
    if refusal is not None:
        return refusal
    worst: tuple[BudgetLimit, int] | None = None
    for limit, want in limits:
        excess = limit.used + want - limit.limit
        if excess > 0 and (worst is None or excess > worst[0].used + worst[1] - worst[0].limit):
            worst = (limit, want)
    if worst is None:
        return None
    limit, want = worst
    return refusals.budget_exceeded(
        key=limit.key, namespace=limit.namespace, limit=limit.limit, in_use=limit.used, requested=want
    )


class BudgetLedger:
    """Usage a pass accepts on top of its snapshot, kept per tenant subtree.

    Mutable on purpose and local to one planning call: the binder accepts
    orders one after another within a pass, and each must see the ones
    before it (R-BIND-6: two orders cannot race past a budget).
    """

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self.extra: dict[str, Usage] = {}

    def refusal(self, namespace: str, demand: Mapping[str, int]) -> Refusal | None:
        return budget_refusal(self._snapshot, namespace, demand, extra=self.extra)

    def accept(self, namespace: str, demand: Mapping[str, int]) -> None:
        added = demand_usage(demand, self._snapshot.classes)
        for tenant in ancestry(namespace):
            self.extra[tenant] = add_usage(self.extra.get(tenant, EMPTY_USAGE), added)
