"""The from-scratch build of the read model: every object converted into its view and each view's
contribution added to empty model tables (``cozygpu.model.derive.ModelTables``) — the event path applied
to an empty model, so a from-scratch build and an update can never derive a fact two ways.

Contract:
- :func:`build_snapshot` is a pure function of iterables of JSON mappings plus ``now``. A caller that
  builds often passes a :class:`ViewMemo` so unchanged objects are not converted again.
- :func:`deriving` is the same in steps (a live model rebuilds with it, and its safety net checks with
  it); :func:`in_slices` runs steps on an event loop, letting the loop go between slices.
- An object that cannot be read is left out and reported through ``on_invalid``.
- A build pauses the cyclic garbage collector while it runs and restores it afterwards (see
  ``cozygpu.cache.collector``): that is its only effect beyond its result.
- :func:`first_difference` compares two snapshots (the safety net's check).
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
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE, DEFAULT_REPORT_STALE_AFTER
from cozygpu.model.derive import STEP, ModelTables, drain
from cozygpu.model.dra import with_rule_taints
from cozygpu.model.dra_tracker import DraTracker
from cozygpu.model.snapshot import Snapshot, VMIView
from cozygpu.views.decode import (
    InvalidObject,
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
from cozygpu.views.decode_dra import (
    device_class_selectors,
    device_taint_rule_view,
    resource_claim_view,
    resource_slice_view,
)
from cozygpu.views.decode_pods import asks_extended, pod_view, vmi_view

#: How long a slice of a rebuild runs before the event loop is let go (``in_slices``).
DEFAULT_SLICE = 0.004

#: Called with (kind, object, problem) for an object left out of the snapshot.
InvalidHandler = Callable[[str, Obj, str], None]

_R = TypeVar("_R")


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
    snapshot rebuilds with (``deriving``: each view's contribution applied to
    an empty ``ModelTables``, the DRA inputs from a ``DraTracker``).
    """
    objects: dict[str, list[Obj]] = {
        "VirtualMachineInstance": list(vmis), keys.GPUCLASS_KIND: list(classes), keys.GPUDEVICE_KIND: list(devices),
        "Node": list(nodes), keys.GPUNODE_KIND: list(gpunodes), "Pod": list(pods), "Namespace": list(namespaces),
        "ResourceSlice": list(slices), "DeviceClass": list(device_classes), "ResourceClaim": list(claims),
        "DeviceTaintRule": list(taint_rules), "ResourceQuota": list(quotas), "KubeVirt": list(kubevirts)}
    tables = ModelTables(hoster_names=tuple(hoster_names), report_stale_after=report_stale_after,
                        launcher_grace=launcher_grace)
    snapshot, _ = drain(deriving(tables, now, objects, on_invalid, memo))
    return snapshot


def deriving(tables: ModelTables, now: datetime, objects: Mapping[str, Sequence[Obj]],
             on_invalid: InvalidHandler | None, memo: ViewMemo | None,
             everything: bool = False) -> Generator[None, None, tuple[Snapshot, DraTracker]]:
    """Every object converted (through ``memo`` when given) and derived by ``tables``, in steps; and the DRA
    tracker of those objects. ``everything``: the change log says anything may have changed
    (``ModelTables.rebuilding``)."""
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
            dra_raw=dra.raw_by_namespace, dra_problems=dra.problems, dra_groups=dra.groups(), everything=everything)
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


async def in_slices(steps: Generator[None, None, _R], budget: float = DEFAULT_SLICE) -> _R:
    """Run steps to their end, letting the event loop go whenever about ``budget`` seconds have passed."""
    started = time.perf_counter()
    try:
        while True:
            try:
                next(steps)
            except StopIteration as done:
                value: _R = done.value
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
    return drain(differences(live, fresh))


def differences(live: Snapshot, fresh: Snapshot) -> Generator[None, None, str | None]:
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


def device_class(obj: Obj) -> tuple[str, tuple[str, ...]]:
    """A DeviceClass as offers read it: its name and selectors."""
    return as_str(as_map(obj.get("metadata")).get("name")), device_class_selectors(obj)


#: The kinds converted into views one by one, each with its converter (VMIs first: they decide which pods).
_VIEWS: dict[str, Callable[[Obj], Any]] = {
    "VirtualMachineInstance": vmi_view, keys.GPUCLASS_KIND: gpu_class_view, keys.GPUDEVICE_KIND: device_view,
    "Node": node_view, keys.GPUNODE_KIND: node_inventory, "Pod": pod_view, "Namespace": namespace_view,
    "ResourceSlice": resource_slice_view, "DeviceClass": device_class, "ResourceClaim": resource_claim_view,
    "DeviceTaintRule": device_taint_rule_view,
}
