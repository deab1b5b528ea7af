"""The read model: one Snapshot of the cache, built once and kept current by events.

Why: every reader (binder, webhooks, catalog, CLI) must decide on the same
model, and a decision must cost what changed, not what the fleet holds.
Objects are decoded into views (``cozygpu.views.decode``) and each view
*contributes* to the model (``cozygpu.model.derive.ModelTables``); an event
takes an object's old contribution away and adds its new one.

Contract:
- :func:`build_snapshot` is the from-scratch build and the reference: a
  pure function of iterables of JSON mappings plus ``now``. A caller that
  builds often passes a :class:`ViewMemo` so unchanged objects are not
  converted again.
- :class:`LiveSnapshot` is fed the cache's events; after any sequence of
  them it equals ``build_snapshot`` over the same objects (property-tested
  in ``tests/views/test_live_snapshot.py``; checked at run time by the
  binder's safety net with :func:`first_difference`).
- An object that cannot be read is left out and reported through
  ``on_invalid``.
- A build pauses the cyclic garbage collector while it runs and restores it
  afterwards (see ``cozygpu.cache.collector``): that is its only effect beyond
  its result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import attrs

from cozygpu import keys
from cozygpu.cache.collector import collector_paused
from cozygpu.cache.store import Event
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE, DEFAULT_REPORT_STALE_AFTER
from cozygpu.model.derive import STEP, ModelTables, drain
from cozygpu.model.dra import ClaimView, DraTracker, with_rule_taints
from cozygpu.model.snapshot import (
    DeviceView,
    GPUClassView,
    NodeInventory,
    NodeView,
    PodView,
    Snapshot,
    VMIView,
)
from cozygpu.views.decode import (
    EMPTY_OBJECT,
    InvalidObject,
    Obj,
    as_map,
    as_str,
    asks_extended,
    device_class_selectors,
    device_taint_rule_view,
    device_view,
    gpu_class_view,
    namespace_view,
    node_inventory,
    node_view,
    permitted_host_devices,
    pod_view,
    resource_claim_view,
    resource_slice_view,
    tenant_quotas,
    vmi_view,
)
from cozygpu.views.specs import SNAPSHOT_SPECS

#: How long a slice of a rebuild runs before the event loop is let go (``LiveSnapshot.refreshed``).
DEFAULT_SLICE = 0.004

#: Node and report changes beyond this many are taken by ``refreshed`` in updates of this many each,
#: the event loop let go between (a fleet's reports refreshed at once: 5,000 in one update held the loop
#: about 0.2 s, in each of the replica's live models).
NODE_CHUNK = 200

#: Called with (kind, object, problem) for an object left out of the snapshot.
InvalidHandler = Callable[[str, Obj, str], None]


class ViewMemo:
    """Views of unchanged objects, reused from one build to the next.

    The binder builds a snapshot every pass and most objects have not changed
    since the last one. A view depends only on its object, so it is kept by
    (kind, namespace, name) with the resourceVersion it was made from; an
    object without a resourceVersion is always converted. Each build forgets
    the objects it did not see, so deleted objects do not pile up. One memo
    per caller; not safe to share between threads.
    """

    def __init__(self) -> None:
        self._views: dict[tuple[str, str, str], tuple[str, Any, str]] = {}
        self._seen: set[tuple[str, str, str]] = set()

    def convert(self, kind: str, obj: Obj, convert: Callable[[Obj], Any]) -> Any:
        meta = as_map(obj.get("metadata"))
        version = meta.get("resourceVersion")
        if not version:
            return convert(obj)
        key = (kind, as_str(meta.get("namespace")), as_str(meta.get("name")))
        self._seen.add(key)
        kept = self._views.get(key)
        if kept is not None and kept[0] == version:
            if kept[2]:
                raise InvalidObject(kept[2])
            return kept[1]
        try:
            view = convert(obj)
        except ValueError as error:
            self._views[key] = (version, None, str(error) or type(error).__name__)
            raise
        self._views[key] = (version, view, "")
        return view

    def forget_unseen(self) -> None:
        """Drop what the last build did not see; call once per build."""
        for key in self._views.keys() - self._seen:
            del self._views[key]
        self._seen.clear()

    def __len__(self) -> int:
        return len(self._views)


def _convert(
    kind: str,
    objects: Iterable[Obj],
    convert: Callable[[Obj], Any],
    on_invalid: InvalidHandler | None,
    memo: ViewMemo | None,
) -> list[Any]:
    views = []
    for obj in objects:
        try:
            views.append(memo.convert(kind, obj, convert) if memo is not None else convert(obj))
        except ValueError as error:  # InvalidObject and QuantityError
            if on_invalid is not None:
                on_invalid(kind, obj, str(error))
    return views


def build_snapshot(
    *,
    now: datetime,
    classes: Iterable[Obj] = (),
    devices: Iterable[Obj] = (),
    gpunodes: Iterable[Obj] = (),
    nodes: Iterable[Obj] = (),
    pods: Iterable[Obj] = (),
    vmis: Iterable[Obj] = (),
    quotas: Iterable[Obj] = (),
    namespaces: Iterable[Obj] = (),
    kubevirts: Iterable[Obj] = (),
    slices: Iterable[Obj] = (),
    device_classes: Iterable[Obj] = (),
    claims: Iterable[Obj] = (),
    taint_rules: Iterable[Obj] = (),
    hoster_names: Iterable[str] = (),
    report_stale_after: timedelta = DEFAULT_REPORT_STALE_AFTER,
    launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE,
    on_invalid: InvalidHandler | None = None,
    memo: ViewMemo | None = None,
) -> Snapshot:
    """The model's Snapshot from the cache's objects, as of ``now``.

    Pass the same ``memo`` to every build of one caller to reuse the views
    of objects whose resourceVersion did not change. The very build a live
    snapshot rebuilds with (``_derived``: each view's contribution applied to
    an empty ``ModelTables``, the DRA inputs from a ``DraTracker``).
    """
    objects: dict[str, list[Obj]] = {
        "VirtualMachineInstance": list(vmis), keys.GPUCLASS_KIND: list(classes), keys.GPUDEVICE_KIND: list(devices),
        "Node": list(nodes), keys.GPUNODE_KIND: list(gpunodes), "Pod": list(pods), "Namespace": list(namespaces),
        "ResourceSlice": list(slices), "DeviceClass": list(device_classes), "ResourceClaim": list(claims),
        "DeviceTaintRule": list(taint_rules), "ResourceQuota": list(quotas), "KubeVirt": list(kubevirts)}
    tables = ModelTables(hoster_names=tuple(hoster_names), report_stale_after=report_stale_after,
                        launcher_grace=launcher_grace)
    snapshot, _ = drain(_derived(tables, now, objects, on_invalid, memo))
    return snapshot


#: The kinds a snapshot is built from, by the names ``LiveSnapshot`` takes them under.
LIVE_KINDS: tuple[str, ...] = tuple(SNAPSHOT_SPECS)


ViewT = TypeVar("ViewT")


class Source:
    """One kind as the caller reads it at snapshot time: its store (by identity), its objects, one of them."""

    def __init__(self, identity: object, objects: Callable[[], Iterable[Obj]],
                 get: Callable[[str, str], Obj | None]) -> None:
        self.identity = identity
        self.objects = objects
        self.get = get


class LiveSnapshot:
    """The snapshot of an informer cache, kept up to date from its events (the binder's, every pass).

    kube-scheduler's ``UpdateSnapshot`` is the idea: keep the last snapshot
    and redo only what moved since. The caller hands every event of the
    kinds in ``LIVE_KINDS`` to :meth:`changed` (a store handler: synchronous,
    cheap: it only notes the key, after comparing the two states' views where
    a heartbeat would otherwise count) and asks :meth:`snapshot` with each
    kind's current store. Then:

    - devices, VMIs, a report that keeps its names or adds known ones, a Node's view, a GPU
      pod or a launcher changed, or a VM started or stopped (a VMI's active
      pods moved and each pod that starts or stops being its launcher asks
      for GPUs, or is gone): each is converted again and
      ``ModelTables.update`` re-derives what it touches (a device's indexes,
      the units it holds, its namespace's ancestry, a VMI's launchers'
      usage, the capacity and availability on their nodes) — what a bind
      request, an answer, a VM start or a kubelet's report costs; a
      launcher window closing re-derives its one pod; a tenant quota
      changed replaces that tenant's budgets; a class that keeps its
      resource name (a device-plugin offer) replaces that class's
      availability;
    - anything else changed that a view reads (another class change, a
      namespace, KubeVirt, a report's names, a VMI's active pods naming a
      pod that asks for no GPU), or a kind's
      store was replaced (served again): every view is taken again through
      the memo (unchanged objects are not converted) and
      ``ModelTables.rebuild`` derives everything;
    - nothing changed: the last snapshot, with ``now`` moved on.

    The result equals :func:`build_snapshot` over the same objects, up to
    the order of the device index tuples (sorted by key here): the property
    test in ``tests/cache`` drives both through random event sequences.
    Not safe to share between threads; one per caller.
    """

    def __init__(
        self,
        *,
        hoster_names: Iterable[str] = (),
        report_stale_after: timedelta = DEFAULT_REPORT_STALE_AFTER,
        launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE,
        on_invalid: InvalidHandler | None = None,
        on_rebuild: Callable[[str], None] | None = None,
    ) -> None:
        self._hoster = tuple(hoster_names)
        #: Told why, each time a rebuild starts (a metric: what makes the model rebuild on a live cluster).
        self._on_rebuild = on_rebuild
        self._stale_after = report_stale_after
        self._on_invalid = on_invalid
        self._grace = launcher_grace
        self._tables = ModelTables(hoster_names=self._hoster, report_stale_after=report_stale_after,
                                  launcher_grace=launcher_grace)
        self._memo = ViewMemo()
        self._identities: dict[str, object] = {}
        self._devices: set[tuple[str, str]] = set()
        self._vmis: set[tuple[str, str]] = set()
        #: GPUNodes whose report changed but kept its names: an update of that one node.
        self._reports: set[tuple[str, str]] = set()
        #: Nodes whose view changed (or that came or went): which classes may use them.
        self._nodes: set[tuple[str, str]] = set()
        #: GPU pods and launchers that changed, came or went: each one's contribution, swapped.
        self._pods: set[tuple[str, str]] = set()
        #: Pod UIDs a VMI started listing as active: their launcher (and so their usage) moved.
        self._launching: set[str] = set()
        #: Pod UIDs a VMI stopped listing as active (and no VMI started listing since): likewise.
        self._unlisted: set[str] = set()
        #: ResourceClaims whose allocation or holder changed, came or went: the DRA units of their nodes.
        self._claims: set[tuple[str, str]] = set()
        #: Tenant quotas whose ``spec.hard`` changed, came or went: those tenants' budgets.
        self._quotas: set[tuple[str, str]] = set()
        #: GPUClasses whose view changed: an update when each keeps its resource name and source.
        self._classes: set[tuple[str, str]] = set()
        #: What DRA classes serve, kept from claim changes between rebuilds (the binder's claims work reads
        #: its offers, device attributes and claims too).
        self.dra = DraTracker((), (), {}, ())
        self._rebuild = True
        #: Why ``_rebuild`` was set (the first build's reason is the stores being new).
        self._why = "first build"
        #: Why the last snapshot was rebuilt or updated, and how many objects it converted (for benches, logs).
        self.last_step = ""

    def changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Note one change (``old`` None when added, ``new`` None when deleted). Never raises."""
        if self._rebuild:
            return
        if kind == keys.GPUDEVICE_KIND:
            self._devices.add(_key_of(new or old or EMPTY_OBJECT))
            return
        if kind == "VirtualMachineInstance":
            self._vmi_changed(old, new)
            return
        if kind == "ResourceClaim":
            if _claim_of(old) != _claim_of(new):
                self._claims.add(_key_of(new or old or EMPTY_OBJECT))
            return
        if not self.matters(kind, old, new):
            return
        if kind == "Node":
            self._nodes.add(_key_of(new or old or EMPTY_OBJECT))
            return
        if kind == "Pod":
            self._pods.add(_key_of(new or old or EMPTY_OBJECT))
            return
        if kind == "ResourceQuota":
            self._quotas.add(_key_of(new or old or EMPTY_OBJECT))
            return
        if kind == keys.GPUCLASS_KIND and old is not None and new is not None:
            try:
                before, after = gpu_class_view(old), gpu_class_view(new)
                if before.resource_name == after.resource_name and before.dra is None and after.dra is None:
                    self._classes.add(_key_of(new))  # its selector, tolerations, ...: ``ModelTables.takes_class``
                    return
            except ValueError:
                pass
        if kind == keys.GPUNODE_KIND and new is not None:
            try:
                # A report that keeps its names or only adds some (a node's first real report after the
                # empty one its GPUNode was made with), or a new node's first one: the update tells whether
                # the names are known; it rebuilds when they are not.
                if old is None or ModelTables.adds_names_only(node_inventory(old), node_inventory(new)):
                    self._reports.add(_key_of(new))
                    return
            except ValueError:
                pass
        self._rebuild, self._why = True, f"{kind} changed"

    def matters(self, kind: str, old: Obj | None, new: Obj | None) -> bool:
        """Whether a change of an object of ``kind`` (not a device or VMI) moves anything a decision reads.

        A heartbeat (a Node's, a quota's usage, a status field no view holds) does not, and neither does
        any change of a pod that asks for no extended resource and launches no VMI here.
        """
        convert = _SAME_VIEW.get(kind)
        if convert is not None and old is not None and new is not None:
            try:
                if convert(old) == convert(new):
                    return False
            except ValueError:
                pass
        return not (kind == "Pod" and not self._wanted_pod(old) and not self._wanted_pod(new))

    def _vmi_changed(self, old: Obj | None, new: Obj | None) -> None:
        """Nothing when its view stayed the same, else an update; the pods that start or stop being its
        launchers are judged when the snapshot is taken (``_launchers_moved``)."""
        try:
            before = vmi_view(old) if old is not None else None
            after = vmi_view(new) if new is not None else None
        except ValueError:
            self._rebuild, self._why = True, "VirtualMachineInstance unreadable"
            return
        if before is not None and before == after:
            return  # nothing a decision reads moved
        was = before.active_pods if before else frozenset()
        listed = after.active_pods if after else frozenset()
        self._launching |= listed - was
        self._unlisted |= was - listed
        self._unlisted -= self._launching
        self._vmis.add(_key_of(new or old or EMPTY_OBJECT))

    def handler(self, kind: str) -> Callable[[Event], None]:
        """A store handler that notes the events of ``kind`` (subscribe it to that kind's informer)."""

        def changed(event: Event) -> None:
            self.changed(kind, event.old, None if event.type == "DELETED" else event.obj)

        return changed

    @property
    def dirty(self) -> bool:
        """Whether a change was noted since the last snapshot (heartbeats are not)."""
        return self._rebuild or any((self._devices, self._vmis, self._reports, self._nodes, self._pods,
                                     self._launching, self._unlisted, self._claims, self._quotas, self._classes))

    def _wanted_pod(self, pod: Obj | None) -> bool:
        if pod is None:
            return False
        current = self._tables.current
        uid = as_str(as_map(pod.get("metadata")).get("uid"))
        return (current is not None and uid in current.launchers) or asks_extended(as_map(pod.get("spec")))

    def snapshot(self, *, now: datetime, sources: Mapping[str, Source | None]) -> Snapshot:
        """The snapshot of ``now`` over ``sources`` (kind -> its store; None while the kind is not served)."""
        if self._needs_rebuild(now, sources):
            return self._build(now, sources)
        changes: dict[tuple[str, str], DeviceView | None] = self._views(
            keys.GPUDEVICE_KIND, self._devices, sources.get(keys.GPUDEVICE_KIND), device_view)
        vmi_changes: dict[tuple[str, str], VMIView | None] = self._views(
            "VirtualMachineInstance", self._vmis, sources.get("VirtualMachineInstance"), vmi_view)
        reports: dict[tuple[str, str], NodeInventory | None] = self._views(
            keys.GPUNODE_KIND, self._reports, sources.get(keys.GPUNODE_KIND), node_inventory)
        nodes: dict[tuple[str, str], NodeView | None] = self._views(
            "Node", self._nodes, sources.get("Node"), node_view)
        pod_source = sources.get("Pod")
        if (self._launching or self._unlisted) and not self._launchers_moved(pod_source):
            return self._build(now, sources, "a VM's launchers moved where pods held may change")
        pods: dict[tuple[str, str], PodView | None] = self._views(
            "Pod", (k for k in self._pods if pod_source is None or self._wanted_pod(pod_source.get(*k))),
            pod_source, pod_view)
        pods.update((key, None) for key in self._pods if key not in pods)  # no longer one the snapshot holds
        claims: dict[tuple[str, str], ClaimView | None] = self._views(
            "ResourceClaim", self._claims, sources.get("ResourceClaim"), resource_claim_view)
        quotas = self._budgets(sources.get("ResourceQuota"))
        classes: dict[tuple[str, str], GPUClassView | None] = self._views(
            keys.GPUCLASS_KIND, self._classes, sources.get(keys.GPUCLASS_KIND), gpu_class_view)
        self._forget_changes()
        class_views = {key[1]: view for key, view in classes.items() if view is not None}
        if len(class_views) < len(classes):
            return self._build(now, sources, f"{keys.GPUCLASS_KIND} changed")
        inventories = {key[1]: view for key, view in reports.items() if view is not None}
        if len(inventories) < len(reports):  # gone or unreadable since: not a change of one node's report
            return self._build(now, sources, "a GPUNode report gone or unreadable")
        self.last_step = (f"update of {len(changes)} device(s)" + (f" and {len(vmi_changes)} VMI(s)"
                                                                   if vmi_changes else "")
                          + (f" and {len(inventories)} report(s)" if inventories else "")
                          + (f" and {len(nodes)} node(s)" if nodes else "")
                          + (f" and {len(pods)} pod(s)" if pods else "")
                          + (f" and {len(claims)} claim(s)" if claims else "")
                          + (f" and {len(quotas)} quota(s)" if quotas else "")
                          + (f" and {len(class_views)} class(es)" if class_views else ""))
        dra = self.dra.claims_changed(claims) if claims else None
        try:
            return self._tables.update(now=now, devices=changes, vmis=vmi_changes, inventories=inventories,
                                         nodes={key[1]: view for key, view in nodes.items()}, pods=pods,
                                         dra=dra.served if dra else None, dra_raw=dra.raw if dra else None,
                                         dra_groups=dra.groups if dra else None, quotas=quotas,
                                         classes=class_views)
        except ValueError as error:  # a report's names or a class's name or source changed after all
            why = (f"{keys.GPUCLASS_KIND} changed" if str(error).startswith(keys.GPUCLASS_KIND)
                   else "a GPUNode report's names changed")
            return self._build(now, sources, why)

    def _budgets(self, quotas: Source | None) -> dict[str, Mapping[str, Any] | None]:
        """The ``spec.hard`` of each changed tenant quota, by namespace (None when gone)."""
        out: dict[str, Mapping[str, Any] | None] = {}
        for namespace, name in self._quotas:
            if name == keys.TENANT_QUOTA_NAME:
                obj = quotas.get(namespace, name) if quotas is not None else None
                out[namespace] = tenant_quotas((obj,)).get(namespace) if obj is not None else None
        return out

    def _launchers_moved(self, pods: Source | None) -> bool:
        """Note the pods VMIs started or stopped listing as active, when which pods the snapshot holds stays
        the same (each asks for extended resources, or is gone); False when it may not (a rebuild's).

        A VM's launcher asks for its GPUs, so a VM start or stop is an update: the launcher was noted when
        it came (or is held already) and only its usage moves. A pod a VMI stops listing that the snapshot
        neither holds nor saw change is gone (a listed pod that exists is held): nothing moves for it —
        a VM's stop, whose launcher goes before its VMI stops listing it.
        """
        current = self._tables.current
        if pods is None or current is None:
            return False
        noted = {as_str(as_map(obj.get("metadata")).get("uid")): key
                 for key in self._pods if (obj := pods.get(*key)) is not None}
        for uid in self._launching | self._unlisted:
            held = current.pods.get(uid)
            key = (held.namespace, held.name) if held is not None else noted.get(uid)
            if key is None:
                if uid in self._unlisted:
                    continue
                return False  # a pod neither held nor noted: it may be one the snapshot would now hold
            obj = pods.get(*key)
            if obj is not None and not asks_extended(as_map(obj.get("spec"))):
                return False  # held only while it launches a VMI
            self._pods.add(key)
        return True

    async def verify(self, *, now: datetime, live: Snapshot, objects: Mapping[str, Sequence[Obj]],
                     budget: float = DEFAULT_SLICE) -> str | None:
        """Build the model again from ``objects`` and compare it with ``live`` (R-BIND-1's safety net).

        ``live`` and the stores' ``objects`` must be of one instant (taken in one step of the event loop,
        ``ReadModel.verify``); the views are then converted afresh (no memo: a memo fault must not hide)
        and derived by new model tables, in slices of about ``budget`` seconds with the loop let go
        between. On a difference the next snapshot is rebuilt from the stores; the first differing
        field and key are returned.
        """
        fresh = ModelTables(hoster_names=self._hoster, report_stale_after=self._stale_after, launcher_grace=self._grace)
        built, _ = await in_slices(_derived(fresh, now, objects, None, None), budget)
        drift = await in_slices(_differences(live, built), budget)
        if drift is not None:
            self._rebuild, self._why = True, "drift found by the safety net"
        return drift

    def _forget_changes(self) -> None:
        for noted in (self._devices, self._vmis, self._reports, self._nodes, self._pods, self._claims,
                      self._quotas, self._classes):
            noted.clear()
        self._launching.clear()
        self._unlisted.clear()

    def _views(self, kind: str, wanted: Iterable[tuple[str, str]], source: Source | None,
               convert: Callable[[Obj], ViewT]) -> dict[tuple[str, str], ViewT | None]:
        """The current view of each key (None when gone or unreadable; an unreadable one is reported)."""
        out: dict[tuple[str, str], ViewT | None] = {}
        for key in wanted:
            obj = source.get(*key) if source is not None else None
            view: ViewT | None = None
            if obj is not None:
                try:
                    view = self._memo.convert(kind, obj, convert)
                except ValueError as error:
                    if self._on_invalid is not None:
                        self._on_invalid(kind, obj, str(error))
            out[key] = view
        return out

    def _build(self, now: datetime, sources: Mapping[str, Source | None], why: str | None = None) -> Snapshot:
        return drain(self._building(now, sources, why))

    async def refreshed(self, *, now: datetime, sources: Mapping[str, Source | None],
                        budget: float = DEFAULT_SLICE) -> Snapshot:
        """:meth:`snapshot`, with a rebuild done in slices of about ``budget`` seconds, the event loop let go
        between them (a first list, a class's new resource name: a few hundred ms at 10,000 nodes, which would stall
        every watch and webhook of the replica).

        The rebuild converts the stores' objects of the instant it starts; what the stores are told after
        is noted as usual and taken by the update that ends this call, so the result is the snapshot of
        the stores as they are when it returns. A change that needs a rebuild again during the slices
        starts another one (up to three; then the last is done at once). Node views and reports changed
        by the thousand (a fleet's agents reporting at once) are taken likewise, ``NODE_CHUNK`` of them an
        update, before the rest.
        """
        for _ in range(3):
            if self._needs_rebuild(now, sources):
                await in_slices(self._building(now, sources), budget)
            elif len(self._reports) + len(self._nodes) > NODE_CHUNK:
                await in_slices(self._updating_nodes(now, sources), budget)
            else:
                break
        return self.snapshot(now=now, sources=sources)

    def _updating_nodes(self, now: datetime, sources: Mapping[str, Source | None]) -> Generator[None, None, None]:
        """The noted reports and Node views, ``NODE_CHUNK`` an update, a step each. Each node's change is
        its own (what it serves, its labels, taints, readiness): taken in any grouping they make the same
        model. A report gone or whose names changed asks for a rebuild instead, and stops."""
        while self._reports or self._nodes:
            keys_reports = [self._reports.pop() for _ in range(min(NODE_CHUNK, len(self._reports)))]
            keys_nodes = [self._nodes.pop() for _ in range(min(NODE_CHUNK - len(keys_reports), len(self._nodes)))]
            reports = self._views(keys.GPUNODE_KIND, keys_reports, sources.get(keys.GPUNODE_KIND), node_inventory)
            nodes = self._views("Node", keys_nodes, sources.get("Node"), node_view)
            inventories = {key[1]: view for key, view in reports.items() if view is not None}
            try:
                if len(inventories) < len(reports):
                    raise ValueError("a report gone or unreadable")
                self._tables.update(now=now, devices={}, inventories=inventories,
                                      nodes={key[1]: view for key, view in nodes.items()})
            except ValueError:  # as ``snapshot`` would: the stores' later state is taken by a rebuild
                self._rebuild, self._why = True, "a GPUNode report gone or its names changed"
                return
            yield

    def _rebuild_reason(self, identities: Mapping[str, object], now: datetime) -> str | None:
        """Why a rebuild is due, or None when an update will do: the stores new or one listed again (another
        store object), a change noted that an update cannot take, no model yet."""
        if not self._identities:
            return "first build"
        replaced = sorted(kind for kind in identities.keys() | self._identities.keys()
                          if identities.get(kind) is not self._identities.get(kind))
        if replaced:
            return f"{replaced[0]} listed again"
        if self._rebuild:
            return self._why
        return "no model yet" if self._tables.needs_rebuild(now) else None

    def _needs_rebuild(self, now: datetime, sources: Mapping[str, Source | None]) -> bool:
        return self._rebuild_reason(_identities(sources), now) is not None

    def _building(self, now: datetime, sources: Mapping[str, Source | None],
                  why: str | None = None) -> Generator[None, None, Snapshot]:
        """The rebuild, in steps: the objects of this instant converted through the memo, then derived."""
        identities = _identities(sources)
        if self._on_rebuild is not None:
            self._on_rebuild(why or self._rebuild_reason(identities, now) or "asked")
        self._identities = identities
        objects = {kind: list(source.objects()) if source is not None else [] for kind, source in sources.items()}
        self._rebuild = False
        self._forget_changes()
        done = False
        try:
            snapshot, self.dra = yield from _derived(self._tables, now, objects, self._on_invalid, self._memo)
            done = True
        finally:
            if not done:  # left half-way (cancelled, or a view raised): the tables are not a snapshot's
                self._rebuild, self._why = True, "a rebuild cut short"
        self.last_step = "rebuild"
        return snapshot


def _derived(tables: ModelTables, now: datetime, objects: Mapping[str, Sequence[Obj]],
             on_invalid: InvalidHandler | None,
             memo: ViewMemo | None) -> Generator[None, None, tuple[Snapshot, DraTracker]]:
    """Every object converted (through ``memo`` when given) and derived by ``tables``, in steps; and the DRA
    tracker of those objects."""
    with collector_paused():  # tens of thousands of acyclic, long-lived views
        views: dict[str, list[Any]] = {}
        for kind, convert in _VIEWS.items():
            listed: Iterable[Obj] = objects.get(kind, ())
            if kind == "Pod":
                wanted = _pods_wanted(views["VirtualMachineInstance"])
                listed = (p for p in listed if wanted(p))
            views[kind] = yield from _converting(kind, listed, convert, on_invalid, memo)
        slices = with_rule_taints(views["ResourceSlice"], (rule for rule in views["DeviceTaintRule"] if rule))
        dra = DraTracker(views[keys.GPUCLASS_KIND], slices, dict(views["DeviceClass"]),
                         views["ResourceClaim"])
        yield
        snapshot = yield from tables.rebuilding(
            now=now, classes=views[keys.GPUCLASS_KIND], devices=views[keys.GPUDEVICE_KIND], nodes=views["Node"],
            inventories=views[keys.GPUNODE_KIND], pods=views["Pod"], vmis=views["VirtualMachineInstance"],
            namespaces=views["Namespace"], quotas=tenant_quotas(objects.get("ResourceQuota", ())),
            permitted=permitted_host_devices(objects.get("KubeVirt", ())), dra=dra.served(),
            dra_raw=dra.raw_by_namespace, dra_problems=dra.problems, dra_groups=dra.groups())
        if memo is not None:
            memo.forget_unseen()
        return snapshot, dra


def _converting(kind: str, objects: Iterable[Obj], convert: Callable[[Obj], Any], on_invalid: InvalidHandler | None,
                memo: ViewMemo | None) -> Generator[None, None, list[Any]]:
    """``_convert`` in steps of ``STEP`` objects."""
    views: list[Any] = []
    chunk: list[Obj] = []
    for obj in objects:
        chunk.append(obj)
        if len(chunk) == STEP:
            views += _convert(kind, chunk, convert, on_invalid, memo)
            chunk = []
            yield
    views += _convert(kind, chunk, convert, on_invalid, memo)
    return views


async def in_slices(steps: Generator[None, None, ViewT], budget: float = DEFAULT_SLICE) -> ViewT:
    """Run steps to their end, letting the event loop go whenever about ``budget`` seconds have passed."""
    started = time.perf_counter()
    try:
        while True:
            try:
                next(steps)
            except StopIteration as done:
                value: ViewT = done.value
                return value
            if time.perf_counter() - started >= budget:
                await asyncio.sleep(0)
                started = time.perf_counter()
    finally:
        steps.close()  # cancelled between slices: the steps' own cleanup runs now, not when collected


def _pods_wanted(vmis: Iterable[VMIView]) -> Callable[[Obj], bool]:
    """The pods a snapshot holds: every VMI's active pods (launchers) and any pod asking for extended resources."""
    active = {uid for vmi in vmis for uid in vmi.active_pods}

    def wanted(pod: Obj) -> bool:
        return as_str(as_map(pod.get("metadata")).get("uid")) in active or asks_extended(as_map(pod.get("spec")))

    return wanted


def first_difference(live: Snapshot, fresh: Snapshot) -> str | None:
    """The first field (and key in it) where two snapshots differ, or None when they are the same.

    Device index tuples are compared as sets: the order of a bucket means nothing. A model's history (its
    generation and change log) is not compared.
    """
    return drain(_differences(live, fresh))


def _differences(live: Snapshot, fresh: Snapshot) -> Generator[None, None, str | None]:
    """``first_difference`` in steps of ``STEP`` keys."""
    for field in (f for f in attrs.fields(Snapshot) if f.eq):
        a, b = getattr(live, field.name), getattr(fresh, field.name)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            unordered = field.name.startswith("devices_by_")
            differing = [key for key in set(a) | set(b) if a.get(key) != b.get(key)] if not unordered else None
            yield
            candidates = sorted(differing if differing is not None else set(a) | set(b), key=repr)
            for i, key in enumerate(candidates, 1):
                x, y = a.get(key), b.get(key)
                if unordered and x is not None and y is not None:
                    x, y = frozenset(x), frozenset(y)
                if x != y:
                    return f"{field.name}[{key!r}]"
                if i % STEP == 0:
                    yield
        elif a != b:
            return field.name
    return None


def _identities(sources: Mapping[str, Source | None]) -> dict[str, object]:
    """Each kind's store, by identity (None while the kind is not served): another one is a relist."""
    return {kind: (source.identity if source is not None else None) for kind, source in sources.items()}


def _device_class(obj: Obj) -> tuple[str, tuple[str, ...]]:
    """A DeviceClass as offers read it: its name and selectors."""
    return as_str(as_map(obj.get("metadata")).get("name")), device_class_selectors(obj)


def _claim_of(obj: Obj | None) -> ClaimView | None:
    return resource_claim_view(obj) if obj is not None else None


def _key_of(obj: Obj) -> tuple[str, str]:
    meta = as_map(obj.get("metadata"))
    return (as_str(meta.get("namespace")), as_str(meta.get("name")))


def _inventory_key(obj: Obj) -> object:
    inventory = node_inventory(obj)
    return (inventory.served, inventory.resource_names, inventory.last_report)


#: Kinds whose events often change nothing a view reads (kubelet and agent heartbeats, status writes).
_SAME_VIEW: dict[str, Callable[[Obj], object]] = {
    "Node": node_view,
    keys.GPUNODE_KIND: _inventory_key,
    keys.GPUCLASS_KIND: gpu_class_view,
    "Namespace": namespace_view,
    "Pod": pod_view,
    "ResourceSlice": resource_slice_view,
    "DeviceClass": _device_class,
    "DeviceTaintRule": device_taint_rule_view,
    "ResourceQuota": lambda obj: (as_map(obj.get("metadata")).get("name"), as_map(obj.get("spec")).get("hard")),
}


#: The kinds converted into views one by one, each with its converter (VMIs first: they decide which pods).
_VIEWS: dict[str, Callable[[Obj], Any]] = {
    "VirtualMachineInstance": vmi_view, keys.GPUCLASS_KIND: gpu_class_view, keys.GPUDEVICE_KIND: device_view,
    "Node": node_view, keys.GPUNODE_KIND: node_inventory, "Pod": pod_view, "Namespace": namespace_view,
    "ResourceSlice": resource_slice_view, "DeviceClass": _device_class, "ResourceClaim": resource_claim_view,
    "DeviceTaintRule": device_taint_rule_view,
}
