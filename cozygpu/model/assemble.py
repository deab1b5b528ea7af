"""Assemble a Snapshot from typed views: derive the effective names, budgets and every index once.

Why: every question the model answers (a catalog entry, an order check, a
placement) reads the same derived tables; computing them per question would
make the catalog O(all devices). Callers convert their cache into views
(``cozygpu.views.live`` does it for the informer cache) and call
:func:`assemble`; tests call it with hand-made views.

Contract: pure; ``now`` is passed in and decides which agent reports are
fresh and which launcher windows are open. There is one derivation: each
device and pod *contributes* to the tables (``Assembly._device``,
``_pod_part``), :func:`assemble` applies every contribution to an empty
:class:`Assembly`, and ``Assembly.update`` takes a changed object's old
contribution away and adds its new one, at the cost of what it touches.

Order of derivation: report freshness -> effective names (R-MOD-9)
-> budgets (R-MOD-2/3) -> device indexes -> launchers (R-MOD-5) -> pod
usage split by the two coverage readers (R-MOD-6) -> subtree usage
(R-MOD-4) -> node capacity (R-MOD-7) -> per-class availability over
eligible nodes (R-MOD-8, R-MOD-12).
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Generator, Iterable, Mapping, MutableMapping
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import attrs

from cozygpu.model import capacity as cap
from cozygpu.model.budgets import read_budgets
from cozygpu.model.coverage import (
    attached_to,
    budget_covering,
    capacity_covering,
    covered_units,
    split_window,
    uncovered,
    window_covering,
)
from cozygpu.model.cow import CowMap
from cozygpu.model.eligibility import node_problem
from cozygpu.model.launchers import launcher_index, launcher_vmi
from cozygpu.model.resource_names import effective_names as derive_effective_names
from cozygpu.model.snapshot import (
    ChangeLog,
    ClassAvailability,
    DeviceKey,
    DeviceView,
    DraGroup,
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
    touch,
)
from cozygpu.model.tenants import is_tenant_namespace, parent_namespace

_K = TypeVar("_K")
_V = TypeVar("_V")


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
    launcher_grace: timedelta = cap.DEFAULT_LAUNCHER_GRACE,
    dra: Mapping[str, Mapping[str, int]] | None = None,
    dra_raw: Mapping[str, Mapping[str, int]] | None = None,
    dra_problems: Mapping[str, tuple[str, ...]] | None = None,
    dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] | None = None,
) -> Snapshot:
    """Build a Snapshot. ``quotas`` maps a tenant namespace to its ``tenant-quota`` ``spec.hard``; ``dra``:
    node -> what DRA-sourced classes serve there, ``dra_raw``: namespace -> the units its own claims hold
    (``model.dra.dra_served``).

    One derivation: every object's contribution applied to an empty :class:`Assembly`, the very
    contributions the live snapshot adds and takes away event by event.
    """
    assembly = Assembly(hoster_names=hoster_names, report_stale_after=report_stale_after,
                        launcher_grace=launcher_grace)
    return assembly.rebuild(now=now, classes=classes, devices=devices, nodes=nodes, inventories=inventories,
                            pods=pods, vmis=vmis, namespaces=namespaces, quotas=quotas, permitted=permitted,
                            dra=dra, dra_raw=dra_raw, dra_problems=dra_problems, dra_groups=dra_groups)


def _alike(old: DeviceView, new: DeviceView) -> bool:
    """Two views of one device that contribute the same (units, usage, index buckets, the VMI attached)."""
    return (old.class_name == new.class_name and old.node_name == new.node_name and old.count == new.count
            and old.phase is new.phase and old.deleting == new.deleting and old.template == new.template
            and (old.attachment.vmi if old.attachment is not None else None)
            == (new.attachment.vmi if new.attachment is not None else None))


def _room(entry: NodeCapacity | None) -> int:
    """The room bucket an entry sits in: its room for new bookings on a fresh report, else 0 (in none)."""
    return entry.room if entry is not None and entry.fresh and entry.room > 0 else 0


def _lost(entries: Mapping[str, NodeCapacity]) -> bool:
    """A fresh report serving less of some name than is held and used (R-BIND-5's capacity lost)."""
    return any(entry.fresh and entry.free < 0 for entry in entries.values())


_R = TypeVar("_R")
#: Items a derivation in steps (``Assembly.rebuilding``) does between two of them: well under a ms each.
STEP: Final = 128


def drain(steps: Generator[None, None, _R]) -> _R:
    """Run steps to their end, at once: their value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            value: _R = done.value
            return value


def _availability(
    gpu_class: GPUClassView,
    serving: tuple[str, ...],
    nodes: Mapping[str, NodeView],
    capacity: Mapping[str, Mapping[str, NodeCapacity]],
) -> ClassAvailability:
    return drain(_availability_steps(gpu_class, serving, nodes, capacity))


def _availability_steps(
    gpu_class: GPUClassView,
    serving: tuple[str, ...],
    nodes: Mapping[str, NodeView],
    capacity: Mapping[str, Mapping[str, NodeCapacity]],
) -> Generator[None, None, ClassAvailability]:
    """A class's availability over the nodes serving its name, yielding every ``STEP`` nodes."""
    node_free: dict[str, int] = {}
    best_node: str | None = None
    best = 0
    total = 0
    served = 0
    for i, node_name in enumerate(serving, 1):
        if i % STEP == 0:
            yield
        if node_problem(
            nodes.get(node_name),
            node_name=node_name,
            tolerations=gpu_class.tolerations,
            selector=gpu_class.node_selector,
        ):
            continue
        entry = capacity[node_name].get(gpu_class.resource_name)
        free = cap.free_for_binds(entry)
        node_free[node_name] = free
        total += free
        served += entry.served if entry is not None else 0
        if free > best:
            best, best_node = free, node_name
    return ClassAvailability(
        class_name=gpu_class.name,
        node_free=node_free,
        free_in_cluster=total,
        served_in_cluster=served,
        free_on_best_node=best,
        best_node=best_node,
    )


# ---------------------------------------------------------------------------
# Incremental assembly: the same Snapshot, kept up to date change by change.


class _Tally:
    """Sums per key with the number of contributions to each: a key is present while anything contributes.

    That is how the from-scratch build's dicts come to hold a key (the first
    contribution creates it), so a tally's ``sums`` equals them key for key.
    """

    __slots__ = ("counts", "sums")

    def __init__(self) -> None:
        self.sums: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def add(self, key: str, amount: int, contributions: int) -> int:
        """Add ``amount`` and ``contributions``; returns +1 when the key appeared, -1 when it went, else 0."""
        before = self.counts.get(key, 0)
        after = before + contributions
        if after:
            self.counts[key] = after
            self.sums[key] = self.sums.get(key, 0) + amount
        else:
            self.counts.pop(key, None)
            self.sums.pop(key, None)
        return (after > 0) - (before > 0)

    def __bool__(self) -> bool:
        return bool(self.counts)


class _Subtrees:
    """One usage table (accepted or pending) by tenant namespace, and its sums over each subtree (R-MOD-4).

    A namespace is an entry while anything contributes to it (``members``);
    every tenant entry is added to itself and each ancestor. Ancestors are
    entries while any descendant is.
    """

    def __init__(self) -> None:
        self.members: dict[str, int] = {}
        self.per_class: dict[str, _Tally] = {}
        self.raw: dict[str, _Tally] = {}
        self.sub_members: dict[str, int] = {}
        self.sub_class: dict[str, _Tally] = {}
        self.sub_raw: dict[str, _Tally] = {}
        #: Subtree roots whose Usage must be made again.
        self.touched: set[str] = set()
        self._chains: dict[str, tuple[str, ...]] = {}
        #: While a first build adds everything: only each namespace's own tallies are kept up.
        self.bulk = False

    def summed(self) -> None:
        """End a first build: add each namespace's own tallies to itself and every ancestor, once."""
        self.bulk = False
        for owns, subs in ((self.per_class, self.sub_class), (self.raw, self.sub_raw)):
            for namespace, own in owns.items():
                for tenant in self.chain(namespace):
                    tally = subs.get(tenant)
                    if tally is None:
                        tally = subs[tenant] = _Tally()
                    for key, amount in own.sums.items():
                        tally.add(key, amount, 1)
                    self.touched.add(tenant)

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
        owns = self.per_class if table == "class" else self.raw
        own = owns.get(namespace)
        if own is None:
            own = owns[namespace] = _Tally()
        presence = own.add(key, amount, sign)
        if self.bulk:
            return  # the subtrees are summed once, by ``summed``
        subs = self.sub_class if table == "class" else self.sub_raw
        touched = self.touched
        for tenant in self.chain(namespace):
            tally = subs.get(tenant)
            if tally is None:
                tally = subs[tenant] = _Tally()
            tally.add(key, amount, presence)
            touched.add(tenant)

    def usage(self, into: MutableMapping[str, Usage]) -> bool:
        """Make the touched subtrees' Usage again in ``into``; whether any came out different."""
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


def _frozen(mapping: MutableMapping[_K, _V]) -> Mapping[_K, _V]:
    """What a Snapshot holds of one of the model's maps: its view, never to change."""
    return mapping.frozen() if isinstance(mapping, CowMap) else mapping


def _add_key(index: MutableMapping[_K, tuple[DeviceKey, ...]], bucket: _K, key: DeviceKey) -> None:
    found = index.get(bucket, ())
    at = bisect.bisect_left(found, key)
    if at < len(found) and found[at] == key:
        return
    index[bucket] = found[:at] + (key,) + found[at:]  # noqa: RUF005 -- joined slices cost a third of unpacking


def _drop_key(index: MutableMapping[_K, tuple[DeviceKey, ...]], bucket: _K, key: DeviceKey) -> None:
    found = index.get(bucket, ())
    at = bisect.bisect_left(found, key)
    if at == len(found) or found[at] != key:
        return
    rest = found[:at] + found[at + 1:]
    if rest:
        index[bucket] = rest
    else:
        del index[bucket]


@attrs.frozen
class _PodPart:
    """What one pod adds: raw units against its namespace's budgets, raw units in use on its node, and
    the units a launcher window keeps apart there until ``closes`` (R-MOD-7)."""

    namespace: str
    beyond_budget: Mapping[str, int]
    node: str | None
    beyond: Mapping[str, int]
    window: Mapping[str, int]
    closes: datetime | None


def _pod_part(
    pod: PodView,
    *,
    names: frozenset[str],
    launchers: Mapping[str, VmiKey],
    vmis: Mapping[VmiKey, VMIView],
    devices: Mapping[DeviceKey, DeviceView],
    by_vmi: Mapping[VmiKey, Iterable[DeviceKey]],
    classes: Mapping[str, GPUClassView],
    now: datetime,
    launcher_grace: timedelta,
) -> _PodPart | None:
    """What one pod contributes (None when nothing): the one derivation both builds use."""
    if pod.final:
        return None
    requests = {n: v for n, v in pod.requests.items() if n in names}
    if not requests:
        return None
    attached: tuple[DeviceView, ...] = ()
    vmi_key = launcher_vmi(pod, launchers)
    vmi = vmis.get(vmi_key) if vmi_key is not None else None
    if vmi is not None:
        attached = tuple(d for d in (devices[k] for k in by_vmi.get(vmi.key, ())) if attached_to(d, vmi))
    budget_cover = budget_covering(attached)
    beyond_budget = uncovered(requests, covered_units(budget_cover, classes))
    beyond: Mapping[str, int] = {}
    window: Mapping[str, int] = {}
    closes: datetime | None = None
    if pod.node_name:
        covering = capacity_covering(attached, pod_node=pod.node_name)
        beyond = beyond_budget  # usually the same devices cover (all Bound on the pod's node)
        if covering != budget_cover:
            beyond = uncovered(requests, covered_units(covering, classes))
        if vmi is None and pod.claims_vmi is not None and beyond:
            claimed = (devices[k] for k in by_vmi.get((pod.namespace, pod.claims_vmi[0]), ()))
            found, closes = window_covering(pod, claimed, now=now, grace=launcher_grace,
                                            vmi_gone=(pod.namespace, pod.claims_vmi[0]) not in vmis)
            if found:
                beyond, window = split_window(beyond, covered_units(found, classes))
    return _PodPart(namespace=pod.namespace, beyond_budget=beyond_budget, node=pod.node_name, beyond=beyond,
                    window=window, closes=closes if window else None)


class Assembly:
    """The Snapshot of a set of views, kept up to date change by change (the binder's, every pass).

    ``rebuild`` takes every view and derives everything; ``update`` takes the
    devices, VMIs (keeping which pods it holds), reports (keeping their names),
    Nodes and pods that changed since, and the reports and launcher windows
    whose time ran out (deadline queues), and re-derives only what they touch: their indexes,
    the units held on their nodes, the usage of their namespace's ancestry,
    the launcher pods of the VMIs they are attached to, those nodes'
    capacity and room buckets, and the availability of the classes served
    there; each touched node, device and VMI goes into the change log.
    Anything else (a class, which pods the VMIs' active pods make it hold, a budget, a namespace,
    KubeVirt, a report's names) is a
    ``rebuild`` — views are not converted again either way (that is the
    caller's memo). Both give what :func:`assemble` gives, except that the
    device index tuples are sorted by key (``assemble`` keeps its input's
    order; nothing reads that order). Each update hands out a new Snapshot:
    the maps it shares with earlier ones are ``CowMap``s, patched without
    being copied, so an earlier Snapshot never changes under its reader.
    """

    def __init__(
        self, *, hoster_names: Iterable[str] = (), report_stale_after: timedelta = cap.DEFAULT_REPORT_STALE_AFTER,
        launcher_grace: timedelta = cap.DEFAULT_LAUNCHER_GRACE,
    ) -> None:
        self._hoster = tuple(hoster_names)
        self._stale_after = report_stale_after
        self._grace = launcher_grace
        self._snapshot: Snapshot | None = None
        #: (when a fresh report turns stale, its node), a heap: a report going stale touches its one node.
        #: Entries a newer report superseded stay until they come up, and are skipped then.
        self._deadlines: list[tuple[datetime, str]] = []
        self._generation = 0
        self._log = ChangeLog()
        #: Pod UID -> when its launcher window closes (R-MOD-7): the snapshot is true until the first.
        self._window_closes: dict[str, datetime] = {}
        #: (when a window closes, its pod's UID), a heap: a window closing re-derives its one pod. Entries of
        #: windows closed or re-derived since stay until they come up, and are skipped then.
        self._window_heap: list[tuple[datetime, str]] = []

    @property
    def current(self) -> Snapshot | None:
        return self._snapshot

    def needs_rebuild(self, now: datetime) -> bool:
        """No snapshot yet (a report turning stale and a launcher window closing are ``update``s)."""
        return self._snapshot is None

    # -- from scratch -------------------------------------------------------------------

    def rebuild(
        self,
        *,
        now: datetime,
        classes: Iterable[GPUClassView],
        devices: Iterable[DeviceView],
        nodes: Iterable[NodeView],
        inventories: Iterable[NodeInventory],
        pods: Iterable[PodView],
        vmis: Iterable[VMIView],
        namespaces: Iterable[NamespaceView],
        quotas: Mapping[str, Mapping[str, object]] | None = None,
        permitted: PermittedHostDevices | None = None,
        dra: Mapping[str, Mapping[str, int]] | None = None,
        dra_raw: Mapping[str, Mapping[str, int]] | None = None,
        dra_problems: Mapping[str, tuple[str, ...]] | None = None,
        dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] | None = None,
    ) -> Snapshot:
        """Everything derived from these views, in one go (``rebuilding`` is the same in steps)."""
        return drain(self.rebuilding(now=now, classes=classes, devices=devices, nodes=nodes,
                                      inventories=inventories, pods=pods, vmis=vmis, namespaces=namespaces,
                                      quotas=quotas, permitted=permitted, dra=dra, dra_raw=dra_raw,
                                      dra_problems=dra_problems, dra_groups=dra_groups))

    def rebuilding(
        self,
        *,
        now: datetime,
        classes: Iterable[GPUClassView],
        devices: Iterable[DeviceView],
        nodes: Iterable[NodeView],
        inventories: Iterable[NodeInventory],
        pods: Iterable[PodView],
        vmis: Iterable[VMIView],
        namespaces: Iterable[NamespaceView],
        quotas: Mapping[str, Mapping[str, object]] | None = None,
        permitted: PermittedHostDevices | None = None,
        dra: Mapping[str, Mapping[str, int]] | None = None,
        dra_raw: Mapping[str, Mapping[str, int]] | None = None,
        dra_problems: Mapping[str, tuple[str, ...]] | None = None,
        dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] | None = None,
    ) -> Generator[None, None, Snapshot]:
        """``rebuild`` as steps: it yields after every ``STEP`` items derived, so a caller on an event loop
        can let the loop go between them; its value is the Snapshot. Nothing but the caller may touch the
        assembly until it is done (``current`` stays the last snapshot meanwhile). ``dra``: node -> the
        units DRA-sourced offers serve there, by resource name (``cap.node_capacity``); ``dra_raw``:
        namespace -> the units of DRA-sourced names its own claims hold (raw use, counted against its budgets
        as a raw pod's; not on the node: the node's DRA units leave those devices out already)."""
        self._classes = {c.name: c for c in classes}
        self._dra_problems = dict(dra_problems or {})
        #: The names DRA offers sell: a node's DRA truth for them is its slices, never a stale report.
        self._dra_names = frozenset(c.resource_name for c in self._classes.values() if c.dra is not None)
        self._nodes: MutableMapping[str, NodeView] = {n.name: n for n in nodes}
        self._dra: dict[str, Mapping[str, int]] = {node: dict(served) for node, served in (dra or {}).items()
                                                   if served}
        #: Node -> resource name -> its groups, for offers with a ``matchAttribute`` (what compaction plans on).
        self._dra_groups: MutableMapping[str, Mapping[str, tuple[DraGroup, ...]]] = {
            node: dict(groups) for node, groups in (dra_groups or {}).items() if groups}
        self._inventories: MutableMapping[str, NodeInventory] = {}
        for inventory in inventories:
            self._inventories[inventory.name] = self._freshened(inventory, now)
        self._deadlines = [(i.last_report + self._stale_after, name) for name, i in self._inventories.items()
                           if i.fresh and i.last_report is not None]
        heapq.heapify(self._deadlines)
        yield
        self._vmis: MutableMapping[VmiKey, VMIView] = {v.key: v for v in vmis}
        self._namespaces = {n.name: n for n in namespaces}
        self._names = derive_effective_names(hoster=self._hoster, classes=self._classes.values(),
                                             inventories=self._inventories.values(), permitted=permitted)
        self._permitted = permitted
        self._budgets: dict[str, TenantBudgets] = {}
        for namespace, hard in (quotas or {}).items():
            if is_tenant_namespace(namespace):
                self._budgets[namespace] = read_budgets(namespace, hard, self._names)
        self._resource_of = {name: c.resource_name for name, c in self._classes.items()}
        self._classes_of: defaultdict[str, list[GPUClassView]] = defaultdict(list)
        for gpu_class in self._classes.values():
            self._classes_of[gpu_class.resource_name].append(gpu_class)
        self._launchers = launcher_index(self._vmis.values())
        #: Pod UID -> every VMI listing it active (an update patches it with the launcher index).
        self._listing: defaultdict[str, set[VmiKey]] = defaultdict(set)
        for vmi_view in self._vmis.values():
            for uid in vmi_view.active_pods:
                self._listing[uid].add(vmi_view.key)

        self._generation += 1
        self._log.rebuilt(self._generation)
        self._devices: MutableMapping[DeviceKey, DeviceView] = {}
        self._unsettled: set[DeviceKey] = set()
        self._unsettled_by_name: dict[str, set[DeviceKey]] = {}
        #: Resource name -> its unsettled devices as the last snapshot has them (made again when they change).
        self._unsettled_frozen: dict[str, frozenset[DeviceKey]] = {}
        self._waiting: set[DeviceKey] = set()
        self._asking: set[DeviceKey] = set()
        self._by_node: MutableMapping[str, tuple[DeviceKey, ...]] = {}
        #: Namespace -> how many devices it holds (its namespaces are part of the tenant tree).
        self._in_namespace: dict[str, int] = {}
        self._namespaces_moved = False
        self._by_vmi: MutableMapping[VmiKey, tuple[DeviceKey, ...]] = {}
        self._held: dict[str, _Tally] = {}
        self._class_held: MutableMapping[str, int] = {}
        #: Class -> (units, how many stopped holds hold that many), by units: compaction's bound (R-BIND-11).
        self._stopped_sizes: MutableMapping[str, tuple[tuple[int, int], ...]] = {}
        self._raw_on_node: dict[str, _Tally] = {}
        self._local = _Subtrees()
        self._pending = _Subtrees()
        self._pods: MutableMapping[str, PodView] = {}
        self._pod_parts: dict[str, _PodPart] = {}
        self._window_on_node: dict[str, _Tally] = {}
        self._window_closes = {}
        self._window_heap = []
        #: VMI key -> UIDs of the pods that claim it: a change of its devices may open or close their window.
        self._claimants: defaultdict[VmiKey, set[str]] = defaultdict(set)
        self._now = now
        self._touched_nodes: set[str] = set()
        # Index buckets as lists while every device is added, sorted once at the end (the same tuples that
        # adding one key at a time by bisection gives, at n log n rather than n squared).
        bulk: dict[str, defaultdict[Any, list[DeviceKey]]] = {
            name: defaultdict(list) for name in ("_by_vmi", "_by_node")}
        self._local.bulk = self._pending.bulk = True
        yield
        #: Devices released after sitting idle (R-LEDGER-2): they hold nothing and are never placed.
        self._released: MutableMapping[DeviceKey, DeviceView] = {}
        for i, device in enumerate(devices, 1):
            if device.phase is Phase.RELEASED:
                self._released[device.key] = device
            else:
                self._device(device, +1, bulk=bulk)
            if i % STEP == 0:
                yield
        for name, lists in bulk.items():
            setattr(self, name, {bucket: tuple(sorted(keys)) for bucket, keys in lists.items()})
            yield
        #: (namespace, name) -> the UID of the pod of that name the snapshot holds (a pod's update finds it).
        self._pod_keys: dict[tuple[str, str], str] = {}
        for i, pod in enumerate(pods, 1):
            self._add_pod(pod)
            if i % STEP == 0:
                yield
        self._dra_raw: dict[str, Mapping[str, int]] = {}
        for namespace, amounts in (dra_raw or {}).items():
            self._claimed(namespace, amounts)
        yield
        self._local.summed()
        self._pending.summed()
        self._subtree: MutableMapping[str, Usage] = {}
        self._pending_usage: MutableMapping[str, Usage] = {}
        self._local.usage(self._subtree)
        self._pending.usage(self._pending_usage)
        self._children = self._make_children()
        yield
        self._namespaces_moved = False
        self._capacity: MutableMapping[str, Mapping[str, NodeCapacity]] = {}
        self._over: frozenset[str] = frozenset()
        for i, node in enumerate(set(self._inventories) | set(self._held) | set(self._raw_on_node)
                                 | set(self._window_on_node) | set(self._dra), 1):
            self._capacity[node] = self._node_capacity(node)
            if i % STEP == 0:
                yield
        over: list[str] = []
        serving: defaultdict[str, list[str]] = defaultdict(list)
        rooms: defaultdict[str, defaultdict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
        for i, (node, entries) in enumerate(self._capacity.items(), 1):
            if _lost(entries):
                over.append(node)
            for name, entry in entries.items():
                if entry.fresh and entry.served > 0:
                    serving[name].append(node)
                if entry.fresh and entry.room > 0:
                    rooms[name][entry.room].append(node)
            if i % STEP == 0:
                yield
        self._over = frozenset(over)
        self._serving: MutableMapping[str, tuple[str, ...]] = {
            name: tuple(sorted(found)) for name, found in serving.items()}
        yield
        self._rooms: MutableMapping[str, Mapping[int, tuple[str, ...]]] = {
            name: {room: tuple(sorted(nodes)) for room, nodes in buckets.items()} for name, buckets in rooms.items()}
        yield
        self._availability: MutableMapping[str, ClassAvailability] = {}
        for gpu_class in self._classes.values():
            self._availability[gpu_class.name] = yield from _availability_steps(
                gpu_class, self._serving.get(gpu_class.resource_name, ()), self._nodes, self._capacity)
        self._touched_nodes.clear()
        for attribute in self._SHARED:
            setattr(self, attribute, CowMap(getattr(self, attribute)))
        return self._emit(now)

    def _freshened(self, inventory: NodeInventory, now: datetime) -> NodeInventory:
        fresh = cap.report_fresh(inventory.last_report, now=now, stale_after=self._stale_after)
        return inventory if inventory.fresh == fresh else attrs.evolve(inventory, fresh=fresh)

    def _expire(self, now: datetime) -> None:
        """The reports whose time ran out by ``now`` turn stale, each touching its one node (R-MOD-7)."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < now:
            deadline, name = heapq.heappop(deadlines)
            inventory = self._inventories.get(name)
            if (inventory is None or not inventory.fresh or inventory.last_report is None
                    or inventory.last_report + self._stale_after != deadline):
                continue  # superseded by a newer report, or gone
            self._inventories[name] = attrs.evolve(inventory, fresh=False)
            self._touched_nodes.add(name)

    def _close_windows(self, now: datetime, generation: int) -> None:
        """The launcher windows closed by ``now``: each pod's part derived again, its GPUs raw use now
        (R-MOD-7); its node is touched, and the VMI it claims logged (its holds are judged on it)."""
        heap = self._window_heap
        while heap and heap[0][0] <= now:
            closes, uid = heapq.heappop(heap)
            pod = self._pods.get(uid)
            if pod is None or self._window_closes.get(uid) != closes:
                continue  # gone, listed, or its window re-derived since
            self._pod(pod, -1)
            self._pod(pod, +1)
            if pod.claims_vmi is not None:
                touch(self._log.vmis, (pod.namespace, pod.claims_vmi[0]), generation)
        if len(heap) > 4 * len(self._window_closes) + 64:  # superseded entries: drop them
            self._window_heap = [(closes, uid) for uid, closes in self._window_closes.items()]
            heapq.heapify(self._window_heap)

    def _report_deadline(self, name: str, inventory: NodeInventory) -> None:
        if inventory.fresh and inventory.last_report is not None:
            heapq.heappush(self._deadlines, (inventory.last_report + self._stale_after, name))
            if len(self._deadlines) > 4 * len(self._inventories) + 64:  # superseded entries: drop them
                self._deadlines = [(i.last_report + self._stale_after, n) for n, i in self._inventories.items()
                                   if i.fresh and i.last_report is not None]
                heapq.heapify(self._deadlines)

    @staticmethod
    def same_names(before: NodeInventory | None, after: NodeInventory | None) -> bool:
        """A report change ``update`` can take: the node reported before and after, with the same names
        (the effective GPU names, R-MOD-9, follow from them; anything else is a rebuild)."""
        return (before is not None and after is not None and before.resource_names == after.resource_names
                and before.served.keys() == after.served.keys())

    @staticmethod
    def adds_names_only(before: NodeInventory | None, after: NodeInventory | None) -> bool:
        """A report change that drops none of the node's names (it may add some, or keep them all)."""
        return (before is not None and after is not None and before.resource_names <= after.resource_names
                and before.served.keys() <= after.served.keys())

    def takes_report(self, name: str, inventory: NodeInventory) -> bool:
        """Whether ``update`` can take this report of node ``name``: one that keeps its names, or a first
        report, or one that only adds names, whose names are all effective GPU names already (a new node
        of a known kind, or a node's first real report after an empty one: the effective names are a
        union over reports, so they stay what they were)."""
        before = self._inventories.get(name)
        if before is not None and self.same_names(before, inventory):
            return True
        if before is not None and not self.adds_names_only(before, inventory):
            return False
        return inventory.resource_names <= self._names and inventory.served.keys() <= self._names

    def takes_class(self, gpu_class: GPUClassView) -> bool:
        """Whether ``update`` can take this class: one it holds, that keeps its resource name and sells
        device-plugin units before and after (its selector, tolerations and anything else may change: the
        effective names, the units held and the DRA offers stay what they were)."""
        before = self._classes.get(gpu_class.name)
        return (before is not None and before.resource_name == gpu_class.resource_name
                and before.dra is None and gpu_class.dra is None)

    # -- change by change ---------------------------------------------------------------

    def update(self, *, now: datetime, devices: Mapping[DeviceKey, DeviceView | None],
               vmis: Mapping[VmiKey, VMIView | None] | None = None,
               inventories: Mapping[str, NodeInventory] | None = None,
               nodes: Mapping[str, NodeView | None] | None = None,
               pods: Mapping[tuple[str, str], PodView | None] | None = None,
               dra: Mapping[str, Mapping[str, int]] | None = None,
               dra_raw: Mapping[str, Mapping[str, int]] | None = None,
               dra_groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]] | None = None,
               quotas: Mapping[str, Mapping[str, object] | None] | None = None,
               classes: Mapping[str, GPUClassView] | None = None) -> Snapshot:
        """The Snapshot after these device, VMI, report and Node changes (a view, or None when it is gone).

        A VMI change may change its ``active_pods`` (absent counts as none) when
        which pods the snapshot holds stays the same (the caller's to know: the
        pods that start or stop being its launchers ask for extended resources,
        or are gone): their usage is judged again with the launcher index
        patched; a pod that two VMIs list takes a rebuild (``ValueError``). A
        report change must keep the node's names, or only add names already
        known (``takes_report``; a first report too): its units, its time and
        its freshness move that one node's capacity and the availability there
        (otherwise ``ValueError``). A Node's
        view (labels, taints, Ready, cordon) moves only which classes may use
        it: the availability of the classes of the names it serves. A pod
        change (by namespace and name; None when it is gone or no longer one
        the snapshot holds) takes its old contribution away and adds its new
        one; it must not change which pods are launchers (that is the VMIs'). A node's DRA units (by
        resource name; empty when it has none left) move that node's capacity, as a report does; a
        namespace's DRA raw use (empty: none left) replaces what it counted against its budgets. A tenant's
        ``tenant-quota`` ``spec.hard`` (None: gone) replaces its budgets: every unsettled order is judged
        again (the change log's usage), as a budget caps a whole subtree. A class that ``takes_class``
        replaces the one held: its availability is made again over the nodes serving its name, and those
        nodes and the name are logged, so the sets there are judged again (one it no longer tolerates
        loses them); any other class change is a ``ValueError`` before anything moved.
        """
        if self._snapshot is None:
            raise RuntimeError("update before the first rebuild")
        self._now = now
        self._generation += 1
        generation, log = self._generation, self._log
        if inventories:
            for name, inventory in inventories.items():
                if not self.takes_report(name, inventory):
                    raise ValueError(f"GPUNode {name}: its resource names changed; rebuild")
        for gpu_class in (classes or {}).values():
            if not self.takes_class(gpu_class):
                raise ValueError(f"GPUClass {gpu_class.name}: new, gone, or its resource name or source changed; "
                                 "rebuild")
        for name, served in (dra or {}).items():
            if served:
                self._dra[name] = dict(served)
            else:
                self._dra.pop(name, None)
            self._touched_nodes.add(name)
        for name, groups in (dra_groups or {}).items():
            if groups:
                self._dra_groups[name] = dict(groups)
            elif name in self._dra_groups:
                del self._dra_groups[name]
        if inventories:
            for name, inventory in inventories.items():
                self._inventories[name] = self._freshened(inventory, now)
                self._report_deadline(name, self._inventories[name])
                self._touched_nodes.add(name)
        self._expire(now)
        self._close_windows(now, generation)
        eligible_changed: list[str] = []
        if nodes:
            for name, node_view in nodes.items():
                if node_view is None:
                    self._nodes.pop(name, None)
                else:
                    self._nodes[name] = node_view
                eligible_changed.append(name)
                touch(log.nodes, name, generation)
        if pods:
            for key, pod_view in pods.items():
                uid = self._pod_keys.get(key)
                if uid is not None:
                    self._drop_pod(self._pods[uid])
                if pod_view is not None:
                    self._add_pod(pod_view)
                for pod_uid in (uid, pod_view.uid if pod_view is not None else None):
                    # A launcher's pod is part of what its VMI's sets are judged on.
                    for vmi_of in self._listing.get(pod_uid, ()) if pod_uid is not None else ():
                        touch(log.vmis, vmi_of, generation)
        if vmis:
            for vmi_key, view in vmis.items():
                before = self._vmis.get(vmi_key)
                was = before.active_pods if before else frozenset()
                now_active = view.active_pods if view else frozenset()
                moved = was ^ now_active
                if any(self._listing.get(uid, set()) - {vmi_key} for uid in moved):
                    # Two VMIs list one pod: which one it launches is the index's order (a rebuild's).
                    raise ValueError(f"VMI {vmi_key[0]}/{vmi_key[1]}: a pod it lists or listed is another's too")
                launchers = [self._pods[uid] for uid in sorted(was | now_active) if uid in self._pods]
                for launcher in launchers:
                    self._pod(launcher, -1)
                if view is None:
                    self._vmis.pop(vmi_key, None)
                else:
                    self._vmis[vmi_key] = view
                if moved:
                    self._launchers = dict(self._launchers)  # a snapshot handed out keeps its own index
                    for uid in was - now_active:
                        self._launchers.pop(uid, None)
                        self._listing.pop(uid, None)
                    for uid in now_active - was:
                        self._launchers[uid] = vmi_key
                        self._listing[uid].add(vmi_key)
                touch(log.vmis, vmi_key, generation)
                for launcher in launchers:
                    self._pod(launcher, +1)
        for namespace, amounts in (dra_raw or {}).items():
            self._claimed(namespace, amounts)
        if quotas:
            self._budgeted(quotas, generation)
        attached_vmis: set[VmiKey] = set()
        for key, device in devices.items():
            touch(log.devices, key, generation)
            old = self._devices.get(key)
            if device is not None and device.phase is Phase.RELEASED:
                self._released[key] = device
                device = None  # released (R-LEDGER-2): out of the model but that map, as if gone
            elif key in self._released:
                del self._released[key]
            if old is not None and device is not None and _alike(old, device):
                # A request, an answer, an attachment's details: the same units, usage and index buckets.
                self._devices[key] = device
                self._track_waiting(key, device)
                if device.attachment is not None:
                    attached_vmis.add((device.namespace, device.attachment.vmi))
                continue
            if old is not None:
                if old.attachment is not None:
                    attached_vmis.add((old.namespace, old.attachment.vmi))
                self._device(old, -1)
            if device is not None:
                if device.attachment is not None:
                    attached_vmis.add((device.namespace, device.attachment.vmi))
                self._device(device, +1)
        for vmi_key in attached_vmis:  # their launchers' (and claimants') usage depends on the devices attached
            vmi = self._vmis.get(vmi_key)
            uids = set(vmi.active_pods) if vmi is not None else set()
            for uid in sorted(uids | self._claimants.get(vmi_key, set())):
                pod = self._pods.get(uid)
                if pod is not None:
                    self._pod(pod, -1)
                    self._pod(pod, +1)
        if self._local.touched and self._local.usage(self._subtree):
            log.usage = generation
        if self._pending.touched:
            self._pending.usage(self._pending_usage)
        if self._namespaces_moved:  # a namespace got its first device or lost its last
            self._namespaces_moved = False
            self._children = self._make_children()
        if self._touched_nodes:
            for node in sorted(self._touched_nodes):
                self._refresh_node(node)
                touch(log.nodes, node, generation)
            self._touched_nodes.clear()
        if eligible_changed:
            for node in sorted(eligible_changed):
                for name, entry in sorted(self._capacity.get(node, {}).items()):
                    for gpu_class in self._classes_of.get(name, ()):
                        self._make_available(gpu_class, node, entry.served)
        if classes:
            self._reclassed(classes, generation)
        return self._emit(now)

    def _reclassed(self, classes: Mapping[str, GPUClassView], generation: int) -> None:
        """Classes replaced (``takes_class``; copies: a snapshot handed out keeps its own): each one's
        availability made again over the nodes serving its name, those nodes and the name logged."""
        self._classes = {**self._classes, **classes}
        for gpu_class in classes.values():
            name = gpu_class.resource_name
            self._classes_of[name] = [gpu_class if c.name == gpu_class.name else c for c in self._classes_of[name]]
            serving = self._serving.get(name, ())
            self._availability[gpu_class.name] = _availability(gpu_class, serving, self._nodes, self._capacity)
            touch(self._log.names, name, generation)
            for node in serving:
                touch(self._log.nodes, node, generation)

    # -- the parts ----------------------------------------------------------------------

    def _budgeted(self, quotas: Mapping[str, Mapping[str, object] | None], generation: int) -> None:
        """Tenants' budgets replaced (a copy: a snapshot handed out keeps its own), and the tree with them."""
        budgets = dict(self._budgets)
        for namespace, hard in quotas.items():
            if not is_tenant_namespace(namespace):
                continue
            if hard is None:
                budgets.pop(namespace, None)
            else:
                budgets[namespace] = read_budgets(namespace, hard, self._names)
        if budgets.keys() != self._budgets.keys():
            self._namespaces_moved = True
        self._budgets = budgets
        self._log.usage = generation

    def _claimed(self, namespace: str, amounts: Mapping[str, int]) -> None:
        """The namespace's own claims now hold ``amounts`` of DRA-sourced names: raw use against its budgets
        (and its ancestors'), what it counted before taken away."""
        before = self._dra_raw.pop(namespace, None)
        if before:
            for name, n in before.items():
                self._local.add("raw", namespace, name, -n, -1)
            self._local.member(namespace, -1)
        if amounts:
            self._dra_raw[namespace] = dict(amounts)
            self._local.member(namespace, +1)
            for name, n in amounts.items():
                self._local.add("raw", namespace, name, n, +1)

    #: The maps a Snapshot shares with the model: each a ``CowMap`` once built, so an update patches
    #: them in place and a Snapshot already handed out keeps its own view.
    _SHARED: Final = ("_devices", "_by_node", "_by_vmi", "_vmis", "_subtree", "_pending_usage", "_inventories",
                      "_nodes", "_pods", "_class_held", "_stopped_sizes", "_capacity", "_serving", "_availability",
                      "_rooms", "_dra_groups", "_released")

    def _device(self, device: DeviceView, sign: int,
                bulk: Mapping[str, defaultdict[Any, list[DeviceKey]]] | None = None) -> None:
        """Add (+1) or take away (-1) everything one device contributes (``bulk``: a first build's lists)."""
        namespace, class_name, node_name, count = device.namespace, device.class_name, device.node_name, device.count
        key = (namespace, device.name)
        resource = self._resource_of.get(class_name)
        if sign > 0:
            self._devices[key] = device
            if device.phase is not Phase.BOUND:
                self._unsettled.add(key)
                self._unsettled_by_name.setdefault(resource or "", set()).add(key)
                self._unsettled_frozen.pop(resource or "", None)
            self._track_waiting(key, device)
        else:
            self._devices.pop(key, None)
            if key in self._unsettled:
                self._unsettled.discard(key)
                of_name = self._unsettled_by_name[resource or ""]
                of_name.discard(key)
                if not of_name:
                    del self._unsettled_by_name[resource or ""]
                self._unsettled_frozen.pop(resource or "", None)
            self._waiting.discard(key)
            self._asking.discard(key)
        held_here = self._in_namespace.get(namespace, 0) + sign
        if held_here:
            self._in_namespace[namespace] = held_here
        else:
            del self._in_namespace[namespace]
        self._namespaces_moved |= held_here == (1 if sign > 0 else 0)
        if bulk is not None:
            if device.attachment is not None:
                bulk["_by_vmi"][(namespace, device.attachment.vmi)].append(key)
            if node_name:
                bulk["_by_node"][node_name].append(key)
        else:
            change = _add_key if sign > 0 else _drop_key
            if device.attachment is not None:
                change(self._by_vmi, (namespace, device.attachment.vmi), key)
            if node_name:
                change(self._by_node, node_name, key)
        if node_name and device.phase is Phase.BOUND and resource is not None:
            held = self._held.setdefault(node_name, _Tally())
            held.add(resource, sign * count, sign)
            if not held:
                del self._held[node_name]
            self._touched_nodes.add(node_name)
            by_class = self._class_held.get(class_name, 0) + sign * count
            if by_class:
                self._class_held[class_name] = by_class
            else:
                self._class_held.pop(class_name, None)
            if device.attachment is None and not device.template and not device.deleting:
                self._stopped(class_name, count, sign)
        if device.phase is not Phase.PENDING:
            table = self._local
        elif not device.deleting:
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

    def _stopped(self, class_name: str, count: int, sign: int) -> None:
        """One stopped hold of ``count`` units added (+1) or taken away (-1): a new tuple each time, as a
        snapshot may hold the old one."""
        sizes = dict(self._stopped_sizes.get(class_name, ()))
        sizes[count] = sizes.get(count, 0) + sign
        if not sizes[count]:
            del sizes[count]
        if sizes:
            self._stopped_sizes[class_name] = tuple(sorted(sizes.items()))
        else:
            self._stopped_sizes.pop(class_name, None)

    def _track_waiting(self, key: DeviceKey, device: DeviceView) -> None:
        """The device is one an answer pass acts on (Pending, or asking) or not."""
        if device.phase is Phase.PENDING or device.unanswered_request:
            self._waiting.add(key)
        else:
            self._waiting.discard(key)
        if device.unanswered_request:
            self._asking.add(key)
        else:
            self._asking.discard(key)

    def _add_pod(self, pod: PodView) -> None:
        self._pods[pod.uid] = pod
        self._pod_keys[(pod.namespace, pod.name)] = pod.uid
        if pod.claims_vmi is not None:
            self._claimants[(pod.namespace, pod.claims_vmi[0])].add(pod.uid)
        self._pod(pod, +1)

    def _drop_pod(self, pod: PodView) -> None:
        self._pod(pod, -1)
        del self._pods[pod.uid]
        del self._pod_keys[(pod.namespace, pod.name)]
        if pod.claims_vmi is not None:
            self._claimants[(pod.namespace, pod.claims_vmi[0])].discard(pod.uid)

    def _pod(self, pod: PodView, sign: int) -> None:
        if sign > 0:
            part = _pod_part(pod, names=self._names, launchers=self._launchers, vmis=self._vmis,
                             devices=self._devices, by_vmi=self._by_vmi, classes=self._classes, now=self._now,
                             launcher_grace=self._grace)
        else:
            part = self._pod_parts.pop(pod.uid, None)
            self._window_closes.pop(pod.uid, None)
        if part is None:
            return
        if sign > 0:
            self._pod_parts[pod.uid] = part
            if part.closes is not None:
                self._window_closes[pod.uid] = part.closes
                heapq.heappush(self._window_heap, (part.closes, pod.uid))
        if part.beyond_budget:
            if sign > 0:
                self._local.member(part.namespace, +1)
            for name, n in part.beyond_budget.items():
                self._local.add("raw", part.namespace, name, sign * n, sign)
            if sign < 0:
                self._local.member(part.namespace, -1)
        for table, amounts in ((self._raw_on_node, part.beyond), (self._window_on_node, part.window)):
            if part.node and amounts:
                on_node = table.setdefault(part.node, _Tally())
                for name, n in amounts.items():
                    on_node.add(name, sign * n, sign)
                if not on_node:
                    del table[part.node]
                self._touched_nodes.add(part.node)

    def _node_capacity(self, node: str) -> dict[str, NodeCapacity]:
        held, raw, window = self._held.get(node), self._raw_on_node.get(node), self._window_on_node.get(node)
        return cap.node_capacity(node, inventory=self._inventories.get(node), held=held.sums if held else {},
                                 raw_in_use=raw.sums if raw else {}, window=window.sums if window else {},
                                 dra=self._dra.get(node), dra_names=self._dra_names)

    def _refresh_node(self, node: str) -> None:
        """A node's capacity changed: its entries, the names it serves, and the availability there."""
        before = self._capacity.get(node)
        present = (node in self._inventories or node in self._held or node in self._raw_on_node
                   or node in self._window_on_node or node in self._dra)
        after = self._node_capacity(node) if present else None
        if after == before:
            return  # the same entries: nothing that follows from them moves either
        if after is not None:
            self._capacity[node] = after
        else:
            self._capacity.pop(node, None)
        before, after = before or {}, after or {}
        if _lost(after) != (node in self._over):
            self._over = self._over ^ {node}
        for name in sorted(set(before) | set(after)):
            if before.get(name) == after.get(name):
                continue
            entry = after.get(name)
            serves = entry is not None and entry.fresh and entry.served > 0
            found = self._serving.get(name, ())
            if serves and node not in found:
                self._serving[name] = tuple(sorted((*found, node)))
            elif not serves and node in found:
                rest = tuple(n for n in found if n != node)
                if rest:
                    self._serving[name] = rest
                else:
                    del self._serving[name]
            was = before.get(name)
            self._move_room(node, name, _room(was), _room(entry))
            for gpu_class in self._classes_of.get(name, ()):
                self._make_available(gpu_class, node, was.served if was is not None else 0)

    def _make_available(self, gpu_class: GPUClassView, node: str, served_before: int) -> None:
        """The class's availability after ``node`` changed; its resource name is logged if that moved."""
        after = self._available(gpu_class, node, served_before)
        if after is not self._availability[gpu_class.name]:
            self._availability[gpu_class.name] = after
            touch(self._log.names, gpu_class.resource_name, self._generation)

    def _move_room(self, node: str, name: str, before: int, after: int) -> None:
        """Move ``node`` from the ``before`` room bucket of ``name`` to the ``after`` one (0: in none)."""
        if before == after:
            return
        touch(self._log.names, name, self._generation)
        buckets = dict(self._rooms.get(name, {}))
        if before > 0:
            rest = tuple(n for n in buckets.get(before, ()) if n != node)
            if rest:
                buckets[before] = rest
            else:
                buckets.pop(before, None)
        if after > 0:
            joined = list(buckets.get(after, ()))
            bisect.insort(joined, node)
            buckets[after] = tuple(joined)
        if buckets:
            self._rooms[name] = buckets
        else:
            self._rooms.pop(name, None)

    def _available(self, gpu_class: GPUClassView, node: str, served_before: int) -> ClassAvailability:
        """The class's availability after ``node`` changed, from the one before (as ``_availability`` makes it).

        ``served_before`` is what the node served of the class's name before the change.
        """
        before = self._availability[gpu_class.name]
        old = before.node_free.get(node)
        entry = self._capacity.get(node, {}).get(gpu_class.resource_name)
        new = None
        if node in self._serving.get(gpu_class.resource_name, ()) and not node_problem(
            self._nodes.get(node), node_name=node, tolerations=gpu_class.tolerations,
            selector=gpu_class.node_selector,
        ):
            new = cap.free_for_binds(entry)
        if new == old and (new is None or served_before == (entry.served if entry is not None else 0)):
            return before  # the node counts for the class as it did: nothing here moved
        node_free = CowMap.on(before.node_free)
        if new is None:
            node_free.pop(node, None)
        else:
            node_free[node] = new
        total = before.free_in_cluster - (old or 0) + (new or 0)
        served = (before.served_in_cluster - (served_before if old is not None else 0)
                  + (entry.served if new is not None and entry is not None else 0))
        best, best_node = before.free_on_best_node, before.best_node
        if best_node == node and (new is None or new < best):
            best, best_node = 0, None  # the best went down: look again, in name order as the full build does
            for name in self._serving.get(gpu_class.resource_name, ()):
                free = node_free.get(name)
                if free is not None and free > best:
                    best, best_node = free, name
        elif new is not None and (new > best or (new == best and new > 0 and best_node is not None
                                                 and node < best_node)):
            best, best_node = new, node
        return ClassAvailability(class_name=gpu_class.name, node_free=node_free.frozen(), free_in_cluster=total,
                                 served_in_cluster=served, free_on_best_node=best, best_node=best_node)

    def _unsettled_names(self) -> dict[str, frozenset[DeviceKey]]:
        frozen = self._unsettled_frozen
        for name, keys in self._unsettled_by_name.items():
            if name not in frozen:
                frozen[name] = frozenset(keys)
        for name in [name for name in frozen if name not in self._unsettled_by_name]:
            del frozen[name]
        return dict(frozen)

    def _make_children(self) -> dict[str, tuple[str, ...]]:
        children: defaultdict[str, list[str]] = defaultdict(list)
        for namespace in set(self._namespaces) | set(self._in_namespace) | set(self._budgets):
            parent = parent_namespace(namespace)
            if parent is not None:
                children[parent].append(namespace)
        return {k: tuple(sorted(v)) for k, v in children.items()}

    def _emit(self, now: datetime) -> Snapshot:
        self._snapshot = Snapshot(
            now=now,
            classes=self._classes,
            devices=_frozen(self._devices),
            nodes=_frozen(self._nodes),
            inventories=_frozen(self._inventories),
            pods=_frozen(self._pods),
            vmis=_frozen(self._vmis),
            namespaces=self._namespaces,
            budgets=self._budgets,
            effective_names=self._names,
            permitted=self._permitted,
            devices_by_node=_frozen(self._by_node),
            devices_by_vmi=_frozen(self._by_vmi),
            launchers=self._launchers,
            children=self._children,
            dra_problems=self._dra_problems,
            subtree_usage=_frozen(self._subtree),
            pending_usage=_frozen(self._pending_usage),
            capacity=_frozen(self._capacity),
            availability=_frozen(self._availability),
            serving=_frozen(self._serving),
            window_closes=min(self._window_closes.values(), default=None),
            over_capacity=self._over,
            held_by_class=_frozen(self._class_held),
            stopped_hold_sizes=_frozen(self._stopped_sizes),
            rooms=_frozen(self._rooms),
            dra_groups=_frozen(self._dra_groups),
            released=_frozen(self._released),
            unsettled=frozenset(self._unsettled),
            unsettled_by_name=self._unsettled_names(),
            asking=frozenset(self._asking),
            waiting=frozenset(self._waiting),
            generation=self._generation,
            log=self._log,
        )
        return self._snapshot
