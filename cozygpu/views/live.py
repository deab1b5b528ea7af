"""The read model of a cache: one Snapshot, built once and kept current by the cache's events.

Why: every reader (binder, webhooks, catalog, CLI) must decide on the same model, and a decision must
cost what changed, not what the fleet holds. Objects are decoded into views (``cozygpu.views.decode``)
and each view *contributes* to the model (``cozygpu.model.derive.ModelTables``); an event takes an
object's old contribution away and adds its new one.

Contract:
- :class:`LiveSnapshot` is fed the cache's events (:meth:`LiveSnapshot.changed`, which only notes keys:
  ``cozygpu.views.changes``) and asked for a snapshot with each kind's current store. After any sequence
  of events it equals ``build_snapshot`` over the same objects (``cozygpu.views.build``; property-tested
  in ``tests/views/test_live_snapshot.py``; checked at run time by the binder's safety net).
- A full rebuild happens for a first list, a kind listed again, drift found by the safety net, and the
  few changes the model's tables cannot take as an update (``ChangeNotes`` says which).
- An object that cannot be read is left out and reported through ``on_invalid``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from cozygpu import keys
from cozygpu.cache.store import Event
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE, DEFAULT_REPORT_STALE_AFTER
from cozygpu.model.derive import KEEP, ModelTables, drain
from cozygpu.model.dra import ClaimView
from cozygpu.model.dra_tracker import DraTracker
from cozygpu.model.snapshot import (
    DeviceView,
    GPUClassView,
    NamespaceView,
    NodeInventory,
    NodeView,
    PodView,
    Snapshot,
    VMIView,
)
from cozygpu.views.build import (
    DEFAULT_SLICE,
    InvalidHandler,
    ViewMemo,
    deriving,
    differences,
    in_slices,
)
from cozygpu.views.changes import DRA_KINDS, ChangeNotes, Key
from cozygpu.views.decode import (
    Obj,
    as_map,
    as_str,
    device_view,
    gpu_class_view,
    namespace_view,
    node_inventory,
    node_view,
    permitted_host_devices,
    tenant_quotas,
)
from cozygpu.views.decode_dra import resource_claim_view
from cozygpu.views.decode_pods import asks_extended, pod_view, vmi_view
from cozygpu.views.specs import SNAPSHOT_SPECS

#: Node and report changes beyond this many are taken by ``refreshed`` in updates of this many each,
#: the event loop let go between (a fleet's reports refreshed at once: 5,000 in one update held the loop
#: about 0.2 s, in each of the replica's live models).
NODE_CHUNK = 200

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
    """The snapshot of an informer cache, kept up to date from its events.

    kube-scheduler's ``UpdateSnapshot`` is the idea: keep the last snapshot and redo only what moved
    since. The caller hands every event of the kinds in ``LIVE_KINDS`` to :meth:`changed` and asks
    :meth:`snapshot` with each kind's current store. What was noted is converted again (through a memo)
    and ``ModelTables.update`` re-derives what it touches; nothing noted: the last snapshot, with ``now``
    moved on. Not safe to share between threads; one per cache.
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
        self._notes = ChangeNotes(self._held)
        #: What DRA classes serve, kept from claim changes between rebuilds (the binder's claims work reads
        #: its offers, device attributes and claims too).
        self.dra = DraTracker((), (), {}, ())
        #: Why the last snapshot was rebuilt or updated, and how many objects it converted (for benches, logs).
        self.last_step = ""

    def _held(self, uid: str) -> bool:
        current = self._tables.current
        return current is not None and uid in current.launchers

    def changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Note one change (``old`` None when added, ``new`` None when deleted). Never raises."""
        self._notes.note(kind, old, new)

    def matters(self, kind: str, old: Obj | None, new: Obj | None) -> bool:
        """Whether a change of an object of ``kind`` (not a device or VMI) moves anything a decision reads."""
        return self._notes.matters(kind, old, new)

    def handler(self, kind: str) -> Callable[[Event], None]:
        """A store handler that notes the events of ``kind`` (subscribe it to that kind's informer)."""

        def changed(event: Event) -> None:
            self._notes.note(kind, event.old, None if event.type == "DELETED" else event.obj)

        return changed

    @property
    def dirty(self) -> bool:
        """Whether a change was noted since the last snapshot (heartbeats are not)."""
        return self._notes.dirty

    def snapshot(self, *, now: datetime, sources: Mapping[str, Source | None]) -> Snapshot:
        """The snapshot of ``now`` over ``sources`` (kind -> its store; None while the kind is not served)."""
        if self._needs_rebuild(now, sources):
            return self._build(now, sources)
        notes = self._notes
        pod_source = sources.get("Pod")
        if (notes.launching or notes.unlisted) and not self._launchers_moved(pod_source):
            return self._build(now, sources, "a VM's launchers moved and no pods are served")
        devices: dict[Key, DeviceView | None] = self._views(
            keys.GPUDEVICE_KIND, notes.devices, sources.get(keys.GPUDEVICE_KIND), device_view)
        vmis: dict[Key, VMIView | None] = self._views(
            "VirtualMachineInstance", notes.vmis, sources.get("VirtualMachineInstance"), vmi_view)
        reports: dict[Key, NodeInventory | None] = self._views(
            keys.GPUNODE_KIND, notes.reports, sources.get(keys.GPUNODE_KIND), node_inventory)
        nodes: dict[Key, NodeView | None] = self._views("Node", notes.nodes, sources.get("Node"), node_view)
        held = self._pods_held()
        pods: dict[Key, PodView | None] = self._views(
            "Pod", (k for k in notes.pods if pod_source is not None and held(pod_source.get(*k))), pod_source,
            pod_view)
        pods.update((key, None) for key in notes.pods if key not in pods)  # no longer one the snapshot holds
        claims: dict[Key, ClaimView | None] = self._views(
            "ResourceClaim", notes.claims, sources.get("ResourceClaim"), resource_claim_view)
        quotas = self._budgets(sources.get("ResourceQuota"))
        classes: dict[Key, GPUClassView | None] = self._views(
            keys.GPUCLASS_KIND, notes.classes, sources.get(keys.GPUCLASS_KIND), gpu_class_view)
        namespaces: dict[Key, NamespaceView | None] = self._views(
            "Namespace", notes.namespaces, sources.get("Namespace"), namespace_view)
        kubevirt = sources.get("KubeVirt")
        permitted: object = KEEP
        if notes.kubevirt:
            permitted = permitted_host_devices(kubevirt.objects() if kubevirt is not None else ())
        self.last_step = "update of " + " and ".join(
            f"{len(found)} {what}" for what, found in (
                ("device(s)", devices), ("VMI(s)", vmis), ("report(s)", reports), ("node(s)", nodes),
                ("pod(s)", pods), ("claim(s)", claims), ("quota(s)", quotas), ("class(es)", classes),
                ("namespace(s)", namespaces), ("KubeVirt table(s)", () if permitted is KEEP else (1,)))
            if found or what == "device(s)")
        notes.forget()
        dra = self.dra.claims_changed(claims) if claims else None
        try:
            return self._tables.update(
                now=now, devices=devices, vmis=vmis, inventories={key[1]: view for key, view in reports.items()},
                nodes={key[1]: view for key, view in nodes.items()}, pods=pods,
                dra=dra.served if dra else None, dra_raw=dra.raw if dra else None,
                dra_groups=dra.groups if dra else None, quotas=quotas,
                classes={key[1]: view for key, view in classes.items()},
                namespaces={key[1]: view for key, view in namespaces.items()}, permitted=permitted)
        except ValueError as error:  # a class selling DRA units, a pod two VMIs list
            return self._build(now, sources, str(error))

    def _budgets(self, quotas: Source | None) -> dict[str, Mapping[str, Any] | None]:
        """The ``spec.hard`` of each changed tenant quota, by namespace (None when gone)."""
        out: dict[str, Mapping[str, Any] | None] = {}
        for namespace, name in self._notes.quotas:
            if name == keys.TENANT_QUOTA_NAME:
                obj = quotas.get(namespace, name) if quotas is not None else None
                out[namespace] = tenant_quotas((obj,)).get(namespace) if obj is not None else None
        return out

    def _launchers_moved(self, pods: Source | None) -> bool:
        """Note the pods VMIs started or stopped listing as active (False when no pods are served).

        A VM's launcher asks for its GPUs, so a VM start or stop is an update: the pod's contribution is
        derived again with the launcher index patched. A listed pod the store does not hold (its event
        not seen yet) is taken when it comes: the model then holds it as a launcher.
        """
        if pods is None or self._tables.current is None:
            return False
        notes = self._notes
        current = self._tables.current
        for uid in notes.launching | notes.unlisted:
            held = current.pods.get(uid)
            key = (held.namespace, held.name) if held is not None else notes.pod_keys.get(uid)
            if key is not None:
                notes.pods.add(key)
        return True

    def _pods_held(self) -> Callable[[Obj | None], bool]:
        """Whether the model holds a pod once the noted VMI changes are taken: one asking for extended
        resources, or a launcher (held now and not unlisted, or listed now)."""
        notes, current = self._notes, self._tables.current
        launchers = current.launchers if current is not None else {}

        def held(pod: Obj | None) -> bool:
            if pod is None:
                return False
            uid = as_str(as_map(pod.get("metadata")).get("uid"))
            return (uid in notes.launching or (uid in launchers and uid not in notes.unlisted)
                    or asks_extended(as_map(pod.get("spec"))))

        return held

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
        built, _ = await in_slices(deriving(fresh, now, objects, None, None), budget)
        drift = await in_slices(differences(live, built), budget)
        if drift is not None:
            self._notes.rebuild_for("drift found by the safety net")
        return drift

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
            elif len(self._notes.reports) + len(self._notes.nodes) > NODE_CHUNK:
                await in_slices(self._updating_nodes(now, sources), budget)
            else:
                break
        return self.snapshot(now=now, sources=sources)

    def _updating_nodes(self, now: datetime, sources: Mapping[str, Source | None]) -> Generator[None, None, None]:
        """The noted reports and Node views, ``NODE_CHUNK`` an update, a step each. Each node's change is
        its own (what it serves, its labels, taints, readiness): taken in any grouping they make the same
        model."""
        notes = self._notes
        while notes.reports or notes.nodes:
            keys_reports = [notes.reports.pop() for _ in range(min(NODE_CHUNK, len(notes.reports)))]
            keys_nodes = [notes.nodes.pop() for _ in range(min(NODE_CHUNK - len(keys_reports), len(notes.nodes)))]
            reports = self._views(keys.GPUNODE_KIND, keys_reports, sources.get(keys.GPUNODE_KIND), node_inventory)
            nodes = self._views("Node", keys_nodes, sources.get("Node"), node_view)
            self._tables.update(now=now, devices={}, inventories={key[1]: view for key, view in reports.items()},
                                nodes={key[1]: view for key, view in nodes.items()})
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
        if self._notes.rebuild:
            return self._notes.why
        return "no model yet" if self._tables.needs_rebuild(now) else None

    def _needs_rebuild(self, now: datetime, sources: Mapping[str, Source | None]) -> bool:
        return self._rebuild_reason(_identities(sources), now) is not None

    def _building(self, now: datetime, sources: Mapping[str, Source | None],
                  why: str | None = None) -> Generator[None, None, Snapshot]:
        """The rebuild, in steps: the objects of this instant converted through the memo, then derived."""
        identities = _identities(sources)
        if self._on_rebuild is not None:
            self._on_rebuild(why or self._rebuild_reason(identities, now) or "asked")
        notes = self._notes
        everything = notes.everything or any(
            identities.get(kind) is not self._identities.get(kind) for kind in (*DRA_KINDS, keys.GPUCLASS_KIND))
        self._identities = identities
        objects = {kind: list(source.objects()) if source is not None else [] for kind, source in sources.items()}
        notes.rebuild = notes.everything = False
        notes.forget()
        notes.listed_pods(objects.get("Pod", ()))
        done = False
        try:
            snapshot, self.dra = yield from deriving(self._tables, now, objects, self._on_invalid, self._memo,
                                                     everything)
            done = True
        finally:
            if not done:  # left half-way (cancelled, or a view raised): the tables are not a snapshot's
                notes.rebuild_for("a rebuild cut short", everything=everything)
        self.last_step = "rebuild"
        return snapshot


def _identities(sources: Mapping[str, Source | None]) -> dict[str, object]:
    """Each kind's store, by identity (None while the kind is not served): another one is a relist."""
    return {kind: (source.identity if source is not None else None) for kind, source in sources.items()}
