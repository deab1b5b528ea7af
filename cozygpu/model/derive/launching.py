"""The launcher index: the VMIs, the pods, which pod launches which VMI (R-MOD-5), and what each pod
contributes: raw units against its namespace's budgets and on its node, and the units a launcher window
keeps apart until it closes (R-MOD-6, R-MOD-7).

Contract: ``part`` derives (+1) or takes back (-1) one pod's contribution; the windows' closing times
are kept on a heap, and ``due`` names the pods whose window closed.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping, MutableMapping
from datetime import datetime, timedelta

import attrs

from cozygpu.model.coverage import (
    attached_to,
    budget_covering,
    capacity_covering,
    covered_units,
    split_window,
    uncovered,
    window_covering,
)
from cozygpu.model.derive.shared import cow
from cozygpu.model.launchers import launcher_index, launcher_vmi
from cozygpu.model.snapshot import DeviceKey, DeviceView, GPUClassView, PodView, VmiKey, VMIView


@attrs.frozen
class PodPart:
    """What one pod adds: raw units against its namespace's budgets, raw units in use on its node, and
    the units a launcher window keeps apart there until ``closes``."""

    namespace: str
    beyond_budget: Mapping[str, int]
    node: str | None
    beyond: Mapping[str, int]
    window: Mapping[str, int]
    closes: datetime | None


def pod_part(
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
) -> PodPart | None:
    """What one pod contributes (None when nothing)."""
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
    return PodPart(namespace=pod.namespace, beyond_budget=beyond_budget, node=pod.node_name, beyond=beyond,
                   window=window, closes=closes if window else None)


class LauncherIndex:
    """The VMIs and pods of a model, which pod launches which VMI, and each pod's contribution."""

    def __init__(self, vmis: Iterable[VMIView] = ()) -> None:
        self.vmis: MutableMapping[VmiKey, VMIView] = {v.key: v for v in vmis}
        self.launchers = launcher_index(self.vmis.values())
        #: Pod UID -> every VMI listing it active (an update patches it with the launcher index).
        self.listing: defaultdict[str, set[VmiKey]] = defaultdict(set)
        for vmi_view in self.vmis.values():
            for uid in vmi_view.active_pods:
                self.listing[uid].add(vmi_view.key)
        self.pods: MutableMapping[str, PodView] = {}
        #: (namespace, name) -> the UID of the pod of that name the snapshot holds (a pod's update finds it).
        self.pod_keys: dict[tuple[str, str], str] = {}
        self._parts: dict[str, PodPart] = {}
        #: Resource name -> UIDs of the pods asking for it (a name that comes or goes re-derives those).
        self.asking: defaultdict[str, set[str]] = defaultdict(set)
        #: VMI key -> UIDs of the pods that claim it: a change of its devices may open or close their window.
        self.claimants: defaultdict[VmiKey, set[str]] = defaultdict(set)
        #: Pod UID -> when its launcher window closes (R-MOD-7): the snapshot is true until the first.
        self.window_closes: dict[str, datetime] = {}
        #: (when a window closes, its pod's UID), a heap: a window closing re-derives its one pod. Entries of
        #: windows closed or re-derived since stay until they come up, and are skipped then.
        self._window_heap: list[tuple[datetime, str]] = []

    def share(self) -> None:
        """The maps a Snapshot holds, as ``CowMap``s from now on."""
        self.vmis, self.pods = cow(self.vmis), cow(self.pods)

    def add(self, pod: PodView) -> None:
        """A pod the model holds (its contribution is ``part``'s)."""
        self.pods[pod.uid] = pod
        self.pod_keys[(pod.namespace, pod.name)] = pod.uid
        for name in pod.requests:
            self.asking[name].add(pod.uid)
        if pod.claims_vmi is not None:
            self.claimants[(pod.namespace, pod.claims_vmi[0])].add(pod.uid)

    def drop(self, pod: PodView) -> None:
        del self.pods[pod.uid]
        del self.pod_keys[(pod.namespace, pod.name)]
        for name in pod.requests:
            asking = self.asking[name]
            asking.discard(pod.uid)
            if not asking:
                del self.asking[name]
        if pod.claims_vmi is not None:
            self.claimants[(pod.namespace, pod.claims_vmi[0])].discard(pod.uid)

    def part(self, pod: PodView, sign: int, *, names: frozenset[str], devices: Mapping[DeviceKey, DeviceView],
             by_vmi: Mapping[VmiKey, Iterable[DeviceKey]], classes: Mapping[str, GPUClassView], now: datetime,
             launcher_grace: timedelta) -> PodPart | None:
        """The pod's contribution derived now and kept (+1), or the one kept taken back (-1)."""
        if sign < 0:
            self.window_closes.pop(pod.uid, None)
            return self._parts.pop(pod.uid, None)
        part = pod_part(pod, names=names, launchers=self.launchers, vmis=self.vmis, devices=devices,
                        by_vmi=by_vmi, classes=classes, now=now, launcher_grace=launcher_grace)
        if part is not None:
            self._parts[pod.uid] = part
            if part.closes is not None:
                self.window_closes[pod.uid] = part.closes
                heapq.heappush(self._window_heap, (part.closes, pod.uid))
        return part

    def asking_for(self, names: Iterable[str]) -> list[PodView]:
        """The pods asking for any of ``names``, sorted by UID."""
        return [self.pods[uid] for uid in sorted({uid for name in names for uid in self.asking.get(name, ())})]

    def due(self, now: datetime) -> list[PodView]:
        """The pods whose launcher window closed by ``now`` (each to be derived again)."""
        heap = self._window_heap
        found: list[PodView] = []
        while heap and heap[0][0] <= now:
            closes, uid = heapq.heappop(heap)
            pod = self.pods.get(uid)
            if pod is None or self.window_closes.get(uid) != closes:
                continue  # gone, listed, or its window re-derived since
            self.window_closes.pop(uid)  # its part is derived again now: no second turn from this entry
            found.append(pod)
        if len(heap) > 4 * len(self.window_closes) + 64:  # superseded entries: drop them
            self._window_heap = [(closes, uid) for uid, closes in self.window_closes.items()]
            heapq.heapify(self._window_heap)
        return found

    def listed(self, key: VmiKey, view: VMIView | None) -> list[PodView]:
        """The pods the VMI lists active before or after this change (sorted by UID); ``ValueError`` when a
        pod it lists or listed is another VMI's too (which one it launches is then a rebuild's to say)."""
        before = self.vmis.get(key)
        was = before.active_pods if before else frozenset()
        now_active = view.active_pods if view else frozenset()
        if any(self.listing.get(uid, set()) - {key} for uid in was ^ now_active):
            raise ValueError(f"VMI {key[0]}/{key[1]}: a pod it lists or listed is another's too")
        return [self.pods[uid] for uid in sorted(was | now_active) if uid in self.pods]

    def put_vmi(self, key: VmiKey, view: VMIView | None) -> None:
        """The VMI's new view (None: gone), and the launcher index patched to its active pods."""
        before = self.vmis.get(key)
        was = before.active_pods if before else frozenset()
        now_active = view.active_pods if view else frozenset()
        if view is None:
            self.vmis.pop(key, None)
        else:
            self.vmis[key] = view
        if was != now_active:
            self.launchers = dict(self.launchers)  # a snapshot handed out keeps its own index
            for uid in was - now_active:
                self.launchers.pop(uid, None)
                self.listing.pop(uid, None)
            for uid in now_active - was:
                self.launchers[uid] = key
                self.listing[uid].add(key)
