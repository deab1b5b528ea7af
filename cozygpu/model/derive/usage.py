"""Tenant usage: what each tenant subtree uses (R-MOD-4), accepted and pending, its budgets, and the tree.

Contract: ``device``, ``pod`` and ``claimed`` add (+1) or take away (-1) one object's usage; ``settle``
makes the Usage of every subtree they touched again (and the tree, when a namespace came or went).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, MutableMapping

from cozygpu.model.budgets import REQUESTS_PREFIX, read_budgets
from cozygpu.model.derive.shared import Stamp, Tally, cow
from cozygpu.model.snapshot import NamespaceView, Phase, TenantBudgets, Usage
from cozygpu.model.tenants import is_tenant_namespace, parent_namespace


class _Subtrees:
    """One usage table (accepted or pending) by tenant namespace, and its sums over each subtree.

    A namespace is an entry while anything contributes to it (``members``).
    Contributions go to the namespace's own tallies; ``usage`` first carries
    what each namespace's own tallies moved since the last call to its tenant
    and every ancestor (once per namespace, however many contributions moved
    it). Ancestors are entries while any descendant is.
    """

    def __init__(self) -> None:
        self.members: dict[str, int] = {}
        self.sub_members: dict[str, int] = {}
        self.sub_class: dict[str, Tally] = {}
        self.sub_raw: dict[str, Tally] = {}
        #: Subtree roots whose Usage must be made again.
        self.touched: set[str] = set()
        self._chains: dict[str, tuple[str, ...]] = {}
        self._own: dict[tuple[str, str], Tally] = {}
        #: (table, namespace) -> its own sums as the subtrees last took them, for each one moved since.
        self._carried: dict[tuple[str, str], dict[str, int]] = {}

    def chain(self, namespace: str) -> tuple[str, ...]:
        """The tenant and its ancestors (none for a namespace of no tenant), worked out once per namespace."""
        found = self._chains.get(namespace)
        if found is None:
            walk: list[str] = []
            if is_tenant_namespace(namespace):
                walk.append(namespace)
                parent = parent_namespace(namespace)
                while parent is not None:
                    walk.append(parent)
                    parent = parent_namespace(parent)
            found = self._chains[namespace] = tuple(walk)
        return found

    def member(self, namespace: str, sign: int) -> None:
        before = self.members.get(namespace, 0)
        after = before + sign
        if after:
            self.members[namespace] = after
        else:
            self.members.pop(namespace, None)
        change = (after > 0) - (before > 0)
        if change:
            for tenant in self.chain(namespace):
                count = self.sub_members.get(tenant, 0) + change
                if count:
                    self.sub_members[tenant] = count
                else:
                    del self.sub_members[tenant]
                self.touched.add(tenant)

    def add(self, table: str, namespace: str, key: str, amount: int, sign: int) -> None:
        """``amount`` of ``key`` (a class, or a resource name for ``raw``) added to the namespace's own tally
        (``sign``: a contribution more or less)."""
        at = (table, namespace)
        own = self._own.get(at)
        if own is None:
            own = self._own[at] = Tally()
        if at not in self._carried:
            self._carried[at] = dict(own.sums)
        own.add(key, amount, sign)

    def _carry(self) -> None:
        """What each namespace's own tallies moved since last carried, added to its tenant and ancestors: a
        key's sum, and whether it is present (a subtree's count of a key is how many namespaces have it)."""
        for (table, namespace), before in self._carried.items():
            after = self._own[(table, namespace)].sums
            subs = self.sub_class if table == "class" else self.sub_raw
            chain = self.chain(namespace)
            for key in before.keys() | after.keys():
                amount = after.get(key, 0) - before.get(key, 0)
                presence = (key in after) - (key in before)
                if not amount and not presence:
                    continue
                for tenant in chain:
                    tally = subs.get(tenant)
                    if tally is None:
                        tally = subs[tenant] = Tally()
                    tally.add(key, amount, presence)
                    self.touched.add(tenant)
        self._carried.clear()

    def usage(self, into: MutableMapping[str, Usage]) -> bool:
        """Make the touched subtrees' Usage again in ``into``; whether any came out different."""
        self._carry()
        changed = False
        for tenant in self.touched:
            if not self.sub_members.get(tenant):
                changed = into.pop(tenant, None) is not None or changed
                continue
            counts = dict(self.sub_class[tenant].sums) if tenant in self.sub_class else {}
            raw = dict(self.sub_raw[tenant].sums) if tenant in self.sub_raw else {}
            usage = Usage(per_class=counts, total=sum(counts.values()), raw=raw)
            if into.get(tenant) != usage:
                into[tenant] = usage
                changed = True
        self.touched.clear()
        return changed


class TenantUsage:
    """The usage of every tenant subtree (accepted and pending), the budgets, and the namespace tree."""

    def __init__(self, namespaces: Iterable[NamespaceView] = ()) -> None:
        self.namespaces: MutableMapping[str, NamespaceView] = {n.name: n for n in namespaces}
        #: Tenant -> its ``tenant-quota`` ``spec.hard`` (its raw budgets are read again when names move).
        self._hard: dict[str, Mapping[str, object]] = {}
        self.budgets: dict[str, TenantBudgets] = {}
        self.subtree: MutableMapping[str, Usage] = {}
        self.pending: MutableMapping[str, Usage] = {}
        #: Namespace -> the units of DRA-sourced names its own claims hold (raw use).
        self.dra_raw: dict[str, Mapping[str, int]] = {}
        self.children: dict[str, tuple[str, ...]] = {}
        self._local = _Subtrees()
        self._pending = _Subtrees()
        #: Namespace -> how many devices it holds (its namespaces are part of the tenant tree).
        self._in_namespace: dict[str, int] = {}
        #: A namespace of the tree came or went: the tree is made again.
        self._moved = True

    def share(self) -> None:
        """The maps a Snapshot holds, as ``CowMap``s from now on."""
        self.subtree, self.pending, self.namespaces = cow(self.subtree), cow(self.pending), cow(self.namespaces)

    def namespace(self, name: str, view: NamespaceView | None) -> None:
        """A namespace's new view (None: gone); the tree is made again when it came or went."""
        self._moved |= (name in self.namespaces) != (view is not None)
        if view is None:
            self.namespaces.pop(name, None)
        else:
            self.namespaces[name] = view
        self._moved = True

    def device(self, namespace: str, class_name: str, resource: str | None, count: int, phase: Phase,
               deleting: bool, sign: int) -> None:
        """One device's usage added (+1) or taken away (-1): accepted unless Pending, pending unless going."""
        held_here = self._in_namespace.get(namespace, 0) + sign
        if held_here:
            self._in_namespace[namespace] = held_here
        else:
            del self._in_namespace[namespace]
        self._moved |= held_here == (1 if sign > 0 else 0)
        if phase is not Phase.PENDING:
            table = self._local
        elif not deleting:
            table = self._pending
        else:
            return
        if sign > 0:
            table.member(namespace, +1)
        table.add("class", namespace, class_name, sign * count, sign)
        if resource is not None:
            table.add("raw", namespace, resource, sign * count, sign)
        if sign < 0:
            table.member(namespace, -1)

    def pod(self, namespace: str, beyond_budget: Mapping[str, int], sign: int) -> None:
        """A pod's raw units beyond what its devices cover, against its namespace's budgets."""
        if not beyond_budget:
            return
        if sign > 0:
            self._local.member(namespace, +1)
        for name, n in beyond_budget.items():
            self._local.add("raw", namespace, name, sign * n, sign)
        if sign < 0:
            self._local.member(namespace, -1)

    def claimed(self, namespace: str, amounts: Mapping[str, int]) -> None:
        """The namespace's own claims now hold ``amounts`` of DRA-sourced names: raw use against its budgets
        (and its ancestors'), what it counted before taken away."""
        before = self.dra_raw.pop(namespace, None)
        if before:
            for name, n in before.items():
                self._local.add("raw", namespace, name, -n, -1)
            self._local.member(namespace, -1)
        if amounts:
            self.dra_raw[namespace] = dict(amounts)
            self._local.member(namespace, +1)
            for name, n in amounts.items():
                self._local.add("raw", namespace, name, n, +1)

    def budgeted(self, quotas: Mapping[str, Mapping[str, object] | None], names: frozenset[str],
                 stamp: Stamp) -> None:
        """Tenants' budgets replaced (a copy: a snapshot handed out keeps its own), and the tree with them;
        every subtree's usage counts as changed (a budget caps a whole subtree)."""
        budgets = dict(self.budgets)
        for namespace, hard in quotas.items():
            if not is_tenant_namespace(namespace):
                continue
            if hard is None:
                budgets.pop(namespace, None)
                self._hard.pop(namespace, None)
            else:
                budgets[namespace] = read_budgets(namespace, hard, names)
                self._hard[namespace] = hard
        if budgets.keys() != self.budgets.keys():
            self._moved = True
        self.budgets = budgets
        stamp.log.usage = stamp.generation

    def renamed(self, moved: frozenset[str], names: frozenset[str], stamp: Stamp) -> None:
        """Names came or went (R-MOD-9): the budgets of the tenants whose quota names one, read again."""
        hit = {namespace: hard for namespace, hard in self._hard.items()
               if any(key.startswith(REQUESTS_PREFIX) and key[len(REQUESTS_PREFIX):] in moved for key in hard)}
        if hit:
            self.budgeted(hit, names, stamp)

    def settle(self, stamp: Stamp) -> None:
        """The touched subtrees' Usage made again (a change of the accepted one is logged), and the tree."""
        if self._local.usage(self.subtree):
            stamp.log.usage = stamp.generation
        self._pending.usage(self.pending)
        if self._moved:  # a namespace got its first device or lost its last, or a budget came or went
            self._moved = False
            children: defaultdict[str, list[str]] = defaultdict(list)
            for namespace in set(self.namespaces) | set(self._in_namespace) | set(self.budgets):
                parent = parent_namespace(namespace)
                if parent is not None:
                    children[parent].append(namespace)
            self.children = {k: tuple(sorted(v)) for k, v in children.items()}
