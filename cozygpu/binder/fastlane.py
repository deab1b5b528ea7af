"""The fast lane for new orders: when an answer pass may bind them too (R-BIND-5 kept).

Why: a new order should not wait for a full pass when nothing ranks ahead
of it. R-BIND-5's full pass runs restore → move → rebind Lost → answer →
bind new orders; the model's ``plan_pass(answers_only=True, new_orders=True)``
runs only the last two. Both plans are the same exactly when the first three
steps of a full pass would decide nothing that changes units (a ``Stay``
changes none), because the last two then start from the same state. This
module keeps the proof of that, from cache events, at the cost of each event
and never of the cluster.

The proof, in two halves:

1. **Settled.** The last full pass planned on a snapshot taken at event
   count ``e`` and wrote every placement it decided (no write dropped, no
   error). After its writes the world is one its own plan leaves in order:
   every set whole on one node that keeps it, or Lost. Since then no
   *ranking* event has arrived: the event counter is still ``e``. A ranking
   event is one that could make a full pass restore, move or rebind a set:

   - Node: its view (labels, Ready, taints, cordon) changed, or it came or
     went; a kubelet heartbeat is not one.
   - GPUNode: units served per resource name, the resource names, or the
     report's freshness changed (a heartbeat that keeps a report fresh is
     not one; a report going stale with time is not either, since a stale
     report never moves a set — it only takes nodes out of choice, the same
     in both plans).
   - GPUClass, tenant ResourceQuota, Namespace, KubeVirt: their view changed
     (budgets move no held set today; they are counted so that a future
     rule that does cannot slip past).
   - VMI with devices attached: its view (phase, node, active pods,
     tolerations, selectors) changed, it came or it went.
   - Pod that uses GPU units (asks for an extended resource) or is a known
     launcher: its node, its finality or its requests changed, it came or
     went.
   - GPUDevice: an accepted device (Bound, Lost) or one becoming accepted
     whose placement (phase, node, class, count, attachment) changed by a
     write that is not the binder's own (another replica, a person), or
     whose attachment changed at all (a device leaving its VMI's set is
     judged without the VMI's tolerations). A new order, a Pending order's
     changes and deletions are not: a deletion only frees units, which
     matters only to Lost sets, and they are the second half.
   The binder's own placement writes are not ranking: before it writes, the
   binder says what each device will hold (``expect``), and an event that
   shows exactly that is its own. Writes that a plan decided leave the world
   in order (they are its plan).

2. **No Lost set that room came back for.** At the settled full pass every
   Lost set found no room (else it was rebound). Without a ranking event,
   units of a resource come free only by a deletion of a Bound device or by
   an answer pass moving a set off a node; so a Lost set can have room now
   only for a resource name freed since the settled pass's snapshot. The
   lane is closed while a device is Lost whose resource name was freed so
   and some Pending order shares a resource name with a Lost device (a set
   of several classes is Lost whole, so each of its names is some Lost
   device's). Lost and Pending devices and the freed names are tracked from
   events and checked against the snapshot: it costs what they are.
   A set split over nodes or partly Lost cannot appear while settled:
   making one takes a foreign placement write or an answer pass whose
   writes failed half way, and both unsettle. The one split set a full pass
   leaves is a set whose VM runs on a node that has no room for the rest
   (``SPLIT_WHILE_VM_RUNS``): like a Lost set, it found no room, and it can
   have room again only where units of its names came free; so its
   resource names count as Lost ones here (``settle(waiting=...)``), and
   orders of other names keep the lane.

An answer pass that dropped a write or failed unsettles too: its plan may
be half written. Until the next full pass settles again, new orders wait
for it, as R-BIND-5 says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import attrs

from cozygpu.base.logging import get_logger
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.store import Event
from cozygpu.model import capacity
from cozygpu.model.placement import Bind, MarkLost, PassPlan
from cozygpu.model.snapshot import DeviceKey, GPUClassView, Phase, Snapshot, VmiKey
from cozygpu.views import decode as convert
from cozygpu.views import specs

log = get_logger("cozygpu.binder.fastlane")

Obj = Mapping[str, Any]
Placement = tuple[str, str | None]


@attrs.frozen
class Mark:
    """Where the events stood when a full pass took its snapshot."""

    events: int
    tick: int

_ACCEPTED = frozenset({Phase.BOUND.value, Phase.LOST.value})


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _key(obj: Obj) -> DeviceKey:
    meta = _map(obj.get("metadata"))
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _phase(obj: Obj) -> str:
    phase = _map(obj.get("status")).get("phase")
    return phase if phase in _ACCEPTED else Phase.PENDING.value


def _placement(obj: Obj) -> Placement:
    status = _map(obj.get("status"))
    return (_phase(obj), str(status.get("nodeName") or "") or None)


def _shape(obj: Obj) -> tuple[object, ...]:
    """What a device's set and units are made of, apart from where it is."""
    spec = _map(obj.get("spec"))
    attachment = _map(_map(obj.get("status")).get("attachment"))
    return (spec.get("className"), spec.get("count"), attachment.get("vmi"), attachment.get("uid"))


def _same_view(old: Obj | None, new: Obj | None, view: Callable[[Obj], object]) -> bool:
    """Whether the two states of an object give the same view (a state that cannot be read differs)."""
    if old is None or new is None:
        return old is None and new is None
    try:
        return view(old) == view(new)
    except ValueError:
        return False


class FastLane:
    """The proof that nothing ranks ahead of new orders (see the module docstring)."""

    def __init__(self, *, wall: Callable[[], datetime], report_stale_after: timedelta) -> None:
        self._wall = wall
        self._stale_after = report_stale_after
        #: Ranking events seen; the last full pass settled at ``_settled``.
        self._events = 0
        self._settled = -1
        self._reason = "no full pass yet"
        #: Resource names of the sets the settled full pass left split while their VMs run.
        self._waiting: frozenset[str] = frozenset()
        #: What the binder's own writes in flight will show: device -> (phase, node).
        self._expected: dict[DeviceKey, Placement] = {}
        self._lost: set[DeviceKey] = set()
        self._pending: set[DeviceKey] = set()
        #: Resource names whose units came free without a ranking event, with the tick they did.
        self._tick = 0
        self._freed: dict[str, int] = {}
        self._classes: Mapping[str, GPUClassView] = {}
        #: From the last snapshot: VMIs some device is attached to, and known launcher pod UIDs.
        self._vmis: frozenset[VmiKey] | Mapping[VmiKey, object] = frozenset()
        self._launchers: Mapping[str, object] = {}

    # -- the state ----------------------------------------------------------------------

    @property
    def settled(self) -> bool:
        """The last full pass settled and no ranking event came since (half 1)."""
        return self._settled == self._events

    @property
    def pending(self) -> frozenset[DeviceKey]:
        """Every device the events showed Pending last (new orders, and orders not accepted yet)."""
        return frozenset(self._pending)

    @property
    def reason(self) -> str:
        """Why the lane is not settled (the last ranking event), for logs."""
        return "" if self.settled else self._reason

    def mark(self) -> Mark:
        """Where the events stand as a full pass snapshots; pass it to ``settle`` when its writes are done."""
        self._tick += 1
        return Mark(events=self._events, tick=self._tick)

    def settle(self, mark: Mark, *, waiting: Iterable[str] = ()) -> None:
        """The full pass planned at ``mark`` wrote every placement it decided.

        ``waiting``: the resource names of the sets it left split while their VMs run; they wait
        for room as Lost sets do.
        """
        self._settled = mark.events
        self._waiting = frozenset(waiting)
        self._freed = {name: tick for name, tick in self._freed.items() if tick > mark.tick}

    def freed(self, name: str | None) -> None:
        """Units of ``name`` came free on some node without a ranking event."""
        if name:
            self._tick += 1
            self._freed[name] = self._tick

    def unsettle(self, reason: str) -> None:
        self._events += 1
        self._reason = reason

    def saw(self, snapshot: Snapshot) -> None:
        """Remember what decides which VMI and pod events rank (attached VMIs, launchers)."""
        self._vmis = snapshot.devices_by_vmi
        self._launchers = snapshot.launchers
        self._classes = snapshot.classes

    def _resource(self, class_name: str) -> str | None:
        gpu_class = self._classes.get(class_name)
        return gpu_class.resource_name if gpu_class is not None else None

    def open(self, snapshot: Snapshot) -> tuple[bool, str]:
        """Whether an answer pass on ``snapshot`` may bind new orders, and why not."""
        if not self.settled:
            return False, self._reason
        if not self._freed:
            return True, ""
        lost_names = set(self._waiting)
        for key in self._lost:
            device = snapshot.devices.get(key)
            gpu_class = snapshot.classes.get(device.class_name) if device is not None else None
            if device is not None and device.phase is Phase.LOST and gpu_class is not None:
                lost_names.add(gpu_class.resource_name)  # a set of an unknown class is never rebound
        freed = sorted(lost_names & self._freed.keys())
        if not freed:
            return True, ""
        for key in self._pending:
            device = snapshot.devices.get(key)
            gpu_class = snapshot.classes.get(device.class_name) if device is not None else None
            if device is not None and device.phase is Phase.PENDING and gpu_class is not None \
                    and gpu_class.resource_name in lost_names:
                return False, f"a Lost or split set may have room again: {', '.join(freed)} came free"
        return True, ""

    # -- the binder's own writes --------------------------------------------------------

    def expect(self, plan: PassPlan, snapshot: Snapshot, *, answers: bool) -> list[DeviceKey]:
        """Say what the plan's placement writes will show before they are sent; returns their devices.

        An answer pass's move frees units on the node left: a Lost set may have room there now.
        """
        keys_: list[DeviceKey] = []
        for action in plan.actions:
            if isinstance(action, Bind):
                self._expected[action.device] = (Phase.BOUND.value, action.node)
                device = snapshot.devices.get(action.device)
                if answers and action.previous and device is not None:
                    self.freed(self._resource(device.class_name))
            elif isinstance(action, MarkLost):
                self._expected[action.device] = (Phase.LOST.value, None)
            else:
                continue
            keys_.append(action.device)
        return keys_

    def dropped(self, dropped: Iterable[DeviceKey]) -> None:
        """Writes refused or never sent: they will show nothing of ours (the others wait for their events)."""
        for key in dropped:
            self._expected.pop(key, None)

    # -- events -------------------------------------------------------------------------

    def device(self, event: Event) -> None:
        new = None if event.type == "DELETED" else event.obj
        old = event.old
        key = _key(event.obj)
        if new is None:
            if old is not None and _placement(old)[0] == Phase.BOUND.value:
                self.freed(self._resource(str(_map(old.get("spec")).get("className") or "")))
            self._lost.discard(key)
            self._pending.discard(key)
            self._expected.pop(key, None)
            return
        phase = _phase(new)
        (self._lost.add if phase == Phase.LOST.value else self._lost.discard)(key)
        (self._pending.add if phase == Phase.PENDING.value else self._pending.discard)(key)
        if old is None:
            if phase != Phase.PENDING.value:
                self.unsettle(f"GPUDevice {key[0]}/{key[1]} appeared {phase}")
            return
        was, now = _placement(old), _placement(new)
        if was[0] == Phase.PENDING.value and now[0] == Phase.PENDING.value:
            return
        if _shape(old) != _shape(new):
            self.unsettle(f"GPUDevice {key[0]}/{key[1]} changed its class, count or attachment")
            return
        if was == now:
            return
        if self._expected.get(key) == now:
            del self._expected[key]
            return
        self.unsettle(f"GPUDevice {key[0]}/{key[1]} was placed by another writer")

    def handlers(self) -> dict[KindSpec, Callable[[Event], None]]:
        """The handler of each other kind whose events can rank."""
        return {
            specs.NODES: self._node,
            specs.GPU_NODES: self._gpunode,
            specs.GPU_CLASSES: self._class,
            specs.PODS: self._pod,
            specs.VMIS: self._vmi,
            specs.TENANT_QUOTAS: self._quota,
            specs.NAMESPACES: self._namespace,
            specs.KUBEVIRTS: self._kubevirt,
        }

    @staticmethod
    def _states(event: Event) -> tuple[Obj | None, Obj | None]:
        return event.old, None if event.type == "DELETED" else event.obj

    def _changed(self, event: Event, view: Callable[[Obj], object], what: str) -> None:
        old, new = self._states(event)
        if not _same_view(old, new, view):
            meta = _map(event.obj.get("metadata"))
            name = "/".join(str(p) for p in (meta.get("namespace"), meta.get("name")) if p)
            self.unsettle(f"{what} {name} changed")

    def _node(self, event: Event) -> None:
        self._changed(event, convert.node_view, "Node")

    def _gpunode(self, event: Event) -> None:
        now = self._wall()

        def view(obj: Obj) -> object:
            inventory = convert.node_inventory(obj)
            fresh = capacity.report_fresh(inventory.last_report, now=now, stale_after=self._stale_after)
            return (inventory.served, inventory.resource_names, fresh)

        self._changed(event, view, "GPUNode")

    def _class(self, event: Event) -> None:
        self._changed(event, convert.gpu_class_view, "GPUClass")

    def _namespace(self, event: Event) -> None:
        self._changed(event, convert.namespace_view, "Namespace")

    def _quota(self, event: Event) -> None:
        self._changed(event, lambda obj: _map(obj.get("spec")).get("hard"), "ResourceQuota")

    def _kubevirt(self, event: Event) -> None:
        self._changed(event, lambda obj: convert.permitted_host_devices([obj]), "KubeVirt")

    def _vmi(self, event: Event) -> None:
        meta = _map(event.obj.get("metadata"))
        if (str(meta.get("namespace") or ""), str(meta.get("name") or "")) not in self._vmis:
            return  # no device is attached to it: its changes move no set
        self._changed(event, convert.vmi_view, "VirtualMachineInstance")

    def _pod(self, event: Event) -> None:
        old, new = self._states(event)
        uid = str(_map(event.obj.get("metadata")).get("uid") or "")
        if uid not in self._launchers and not any(
                obj is not None and convert.asks_extended(_map(obj.get("spec"))) for obj in (old, new)):
            return  # uses no GPU and runs no VM with devices

        def view(obj: Obj) -> object:
            pod = convert.pod_view(obj)
            return (pod.node_name, pod.final, pod.requests)

        self._changed(event, view, "Pod")
