"""Placement: where a set of devices goes, and what one binder pass does (R-BIND-4..6).

Why: the binder is the only writer of placement, and the VMI webhook must
refuse a start the binder would refuse. Both ask this module, so a webhook's
dry check and the binder's answer cannot disagree.

Contract:
- **Sets (R-BIND-4).** The devices one VMI names (attached to it) form a
  set; an unattached device is a set of one. A set's accepted members are
  all Bound on one node or all Lost; a plan never leaves one split.
- **Choice.** A set goes to the *fullest node with room*: among eligible
  nodes with a fresh report and enough free units for every resource name
  the set needs, the one that keeps the fewest units free afterwards.
  Nodes already holding members come first (fewest units moved). Ties break
  by node name, so two planners on the same snapshot choose the same node.
- **Pass order (R-BIND-5).** restore set invariants -> move held sets off
  nodes that cannot keep them (gone, not Ready, untolerated taint,
  selector, cordon, then capacity lost) -> rebind Lost sets -> answer bind
  requests -> bind new orders (oldest first). An answer pass does only the
  answers (R-BIND-3).
- **One rule (R-BIND-5, R-BIND-6).** Whether a held set keeps its node is
  one policy, ``keep_or_move``: its node first (a problem other than a
  cordon moves it; a cordon alone keeps it as a ``Stay`` when a member's
  class says ``onCordon: Stay`` or no other node has room), then its node's
  capacity (on a node whose fresh report serves fewer units than are held
  and used, sets leave larger first until it fits).
- **Running VMs (R-BIND-7).** A set whose VMI has a running launcher pod is
  never moved or sent to Lost: whatever its node's problem it is a ``Stay``
  (``its VM runs there``), and the capacity-lost rule passes it over. The
  only node such a set may go to is its launcher's: a set found split (a
  fault) is gathered there, the member the VM uses staying put, or left
  split with a ``Stay`` (``SPLIT_WHILE_VM_RUNS``) when that node cannot take
  the rest; an answer for it is refused the same way.
- **Where to.** Where a set goes is one choice, ``destination``: the
  fullest node with room, else Lost. The full pass and the answer path
  both use them, and every move carries its cause. A stale report is never
  a reason to move.
- **One answer.** ``place_set``, an answer pass and a full pass answer a
  request alike wherever nothing earlier in the plan changed the units,
  budgets or devices its answer reads (a property test pins it); a
  Succeeded answer on a cordoned node carries its ``Stay``.
- **Re-checks.** New orders pass the same class, count and budget checks as
  admission, against the snapshot plus what this pass already accepted, so
  two orders cannot race past a budget or a node's free units.
The plan is a list of actions; the binder writes them. Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TypeVar

import attrs

from cozygpu.model import refusals
from cozygpu.model.budgets import BudgetLedger, add_usage, demand_usage
from cozygpu.model.catalog import class_problem
from cozygpu.model.classes import count_problem
from cozygpu.model.coverage import attached_to
from cozygpu.model.eligibility import node_problem
from cozygpu.model.refusals import Reason, Refusal
from cozygpu.model.snapshot import (
    DeviceKey,
    DeviceView,
    GPUClassView,
    NodeCapacity,
    OnCordon,
    Phase,
    Snapshot,
    Toleration,
    Usage,
    VmiKey,
    VMIView,
)
from cozygpu.model.tenants import ancestry

_NO_CAPACITY: Mapping[str, NodeCapacity] = {}
_NO_ROOMS: Mapping[int, tuple[str, ...]] = {}
SUCCEEDED = "Succeeded"
FAILED = "Failed"


@attrs.frozen(kw_only=True)
class DeviceSet:
    """The devices that move, go Lost and are rebound together."""

    vmi: VmiKey | None
    members: tuple[DeviceKey, ...]

    @property
    def label(self) -> str:
        if self.vmi is not None:
            return f"VMI {self.vmi[0]}/{self.vmi[1]}"
        namespace, name = self.members[0]
        return f"GPUDevice {namespace}/{name}"


@attrs.frozen(kw_only=True)
class Bind:
    """Bind (or move) a device onto a node: ``status.phase=Bound``, ``status.nodeName=node``."""

    device: DeviceKey
    node: str
    previous: str | None = None
    #: Why it moved off ``previous`` (None for a new bind, a rebind or a gather).
    cause: Refusal | None = None


@attrs.frozen(kw_only=True)
class MarkLost:
    """The device's node cannot keep it and no node has room: ``status.phase=Lost``, no node."""

    device: DeviceKey
    previous: str | None
    cause: Refusal


@attrs.frozen(kw_only=True)
class KeepPending:
    """An order that cannot be accepted now; it stays Pending with a condition saying why."""

    device: DeviceKey
    refusal: Refusal


@attrs.frozen(kw_only=True)
class Stay:
    """A set kept on a cordoned node (R-BIND-6); for conditions and the CLI."""

    devices: tuple[DeviceKey, ...]
    node: str
    cause: Refusal
    why: str


@attrs.frozen(kw_only=True)
class Answer:
    """The answer to a bind request, written into ``status.bindAnswer``."""

    device: DeviceKey
    request_id: str
    result: str
    node: str | None = None
    refusal: Refusal | None = None


Action = Bind | MarkLost | KeepPending | Stay | Answer
_A = TypeVar("_A", Bind, MarkLost, KeepPending, Stay, Answer)


@attrs.frozen(kw_only=True)
class PassPlan:
    actions: tuple[Action, ...]

    def of(self, kind: type[_A]) -> tuple[_A, ...]:
        """The actions of one kind, in plan order."""
        return tuple(a for a in self.actions if isinstance(a, kind))


@attrs.frozen(kw_only=True)
class SetPlacement:
    """Where a set would go (``node``), or why it cannot (``refusal``)."""

    node: str | None
    refusal: Refusal | None
    moves: tuple[Bind, ...] = ()
    #: The set stays on its cordoned node (R-BIND-6): a Succeeded answer says "stays", not "bound".
    stay: Stay | None = None


def device_sets(snapshot: Snapshot) -> tuple[DeviceSet, ...]:
    """Every set in the snapshot, sorted by key: one per attached VMI, one per unattached device."""
    sets: list[DeviceSet] = []
    for vmi_key, members in snapshot.devices_by_vmi.items():
        vmi = snapshot.vmis.get(vmi_key)
        # A member attached to an earlier VMI of the same name (another UID) is not this
        # VMI's: it stands alone, like an unattached device, rather than drop out of every set.
        current = [k for k in members if vmi is None or attached_to(snapshot.devices[k], vmi)]
        if current:
            sets.append(DeviceSet(vmi=vmi_key, members=tuple(sorted(current))))
        sets.extend(DeviceSet(vmi=None, members=(k,)) for k in sorted(set(members) - set(current)))
    for key, device in snapshot.devices.items():
        if device.attachment is None:
            sets.append(DeviceSet(vmi=None, members=(key,)))
    sets.sort(key=lambda s: (s.vmi or s.members[0], s.vmi is None))
    return tuple(sets)


@attrs.frozen
class _Keep:
    """The set keeps its node."""


@attrs.frozen(kw_only=True)
class _Stay:
    """The set stays on its cordoned node (R-BIND-6)."""

    cause: Refusal
    why: str


@attrs.frozen(kw_only=True)
class _Move:
    """The set goes to ``node``; ``cause`` is why it leaves the node it holds (None for a gather or a rebind)."""

    node: str
    cause: Refusal | None


@attrs.frozen(kw_only=True)
class _Lost:
    """No node has room: the held set goes Lost for ``cause``; a request for it is refused with ``no_room``."""

    cause: Refusal
    no_room: Refusal


_Decision = _Keep | _Stay | _Move | _Lost
_KEEP = _Keep()
ON_CORDON_STAY = "onCordon: Stay"
NO_ROOM_ELSEWHERE = "no other node has room"
#: Why a set whose VMI has a running launcher keeps its node whatever the node's problem (R-BIND-7).
VM_RUNS_THERE = "its VM runs there"
#: Why a split set whose VMI runs is left split: its launcher's node, the only one it may go to, cannot take it.
SPLIT_WHILE_VM_RUNS = "its VM runs there and the node cannot take the rest of the set"


@attrs.define
class _Work:
    """A set being planned: its members as views, its VMI if known."""

    label: str
    vmi: VMIView | None
    members: list[DeviceView]


class _Planner:
    """One planning run over a snapshot. Mutable scratch state, local to one call."""

    def __init__(self, snapshot: Snapshot, works: Sequence[_Work] | None = None) -> None:
        self.s = snapshot
        self.state: dict[DeviceKey, tuple[Phase, str | None]] = {}
        # (node, resource name) -> units this pass booked there (negative: freed), on top of the snapshot's
        # room; per name, the nodes booked on (``choose`` weighs them apart from the snapshot's room buckets).
        self._booked: dict[tuple[str, str], int] = {}
        self._booked_nodes: dict[str, set[str]] = {}
        self.budget = BudgetLedger(snapshot)
        self.actions: list[Action] = []
        self.lost_now: set[DeviceKey] = set()
        #: Stays written in this pass, by their devices: a set is decided once a pass.
        self._stays: dict[tuple[DeviceKey, ...], Stay] = {}
        self._works = works
        self._eligible_cache: dict[tuple[object, ...], frozenset[str]] = {}

    # -- state ---------------------------------------------------------------

    def where(self, device: DeviceView) -> tuple[Phase, str | None]:
        return self.state.get(device.key, (device.phase, device.node_name))

    def _entry(self, node: str, name: str) -> NodeCapacity | None:
        """The node's capacity for the name on a fresh report; None on a stale or missing one."""
        entry = self.s.capacity.get(node, _NO_CAPACITY).get(name)
        return entry if entry is not None and entry.fresh else None

    def free(self, node: str, name: str) -> int:
        """Units a booking may take now; zero on a stale or missing report, negative when full or lost."""
        entry = self._entry(node, name)
        return entry.room + self._booked.get((node, name), 0) if entry is not None else 0

    def kept(self, node: str, name: str) -> int:
        """Free units now with a launcher window's given back: below zero only when capacity was lost (R-MOD-7)."""
        entry = self._entry(node, name)
        return self.free(node, name) + (entry.window if entry is not None else 0)

    def max_free(self, name: str) -> int:
        """The most free units of ``name`` on one node now (at least 0): from the room buckets, not the nodes."""
        booked = self._booked_nodes.get(name, ())
        best = max([0, *(self.free(node, name) for node in booked)])
        buckets = self.s.rooms.get(name, _NO_ROOMS)
        for room in sorted(buckets, reverse=True):
            if room <= best:
                break
            if any(node not in booked for node in buckets[room]):
                return room
        return best

    def fullest(self, name: str, units: int, candidates: Collection[str], skip: Collection[str]) -> str | None:
        """The fullest candidate node with room for ``units`` of ``name`` (R-BIND-5; ties by node name).

        The snapshot's room buckets are walked from ``units`` up, in name order within a bucket, so the
        first candidate met is the best of the nodes this pass has not booked on; those are weighed apart.
        """
        booked = self._booked_nodes.get(name, ())
        best: tuple[int, str] | None = None
        buckets = self.s.rooms.get(name, _NO_ROOMS)
        for room in sorted(r for r in buckets if r >= units):
            found = next((node for node in buckets[room]
                          if node in candidates and node not in booked and node not in skip), None)
            if found is not None:
                best = (room - units, found)
                break
        for node in booked:
            left = self.free(node, name) - units
            if left >= 0 and node in candidates and node not in skip and (best is None or (left, node) < best):
                best = (left, node)
        return best[1] if best is not None else None

    def _book(self, node: str, name: str, units: int) -> None:
        if self._entry(node, name) is not None:
            key = (node, name)
            self._booked[key] = self._booked.get(key, 0) - units
            self._booked_nodes.setdefault(name, set()).add(node)

    def resource(self, device: DeviceView) -> str | None:
        gpu_class = self.s.classes.get(device.class_name)
        return gpu_class.resource_name if gpu_class is not None else None

    # -- eligibility ---------------------------------------------------------

    def classes_of(self, work: _Work) -> list[GPUClassView] | None:
        found: dict[str, GPUClassView] = {}
        for device in work.members:
            gpu_class = self.s.classes.get(device.class_name)
            if gpu_class is None:
                return None
            found[gpu_class.name] = gpu_class
        return [found[name] for name in sorted(found)]

    def _tolerations(self, work: _Work, classes: Sequence[GPUClassView]) -> tuple[Toleration, ...]:
        held: list[Toleration] = list(work.vmi.tolerations) if work.vmi is not None else []
        for gpu_class in classes:
            held.extend(gpu_class.tolerations)
        return tuple(held)

    def node_problem(self, work: _Work, node: str, classes: Sequence[GPUClassView]) -> Refusal | None:
        view = self.s.nodes.get(node)
        tolerations = self._tolerations(work, classes)
        node_selector = work.vmi.node_selector if work.vmi is not None else None
        affinity = work.vmi.node_affinity if work.vmi is not None else None
        problem: Refusal | None = None
        selectors = [c.node_selector for c in classes] or [None]
        for selector in selectors:
            found = node_problem(
                view,
                node_name=node,
                tolerations=tolerations,
                selector=selector,
                node_selector=node_selector,
                node_affinity=affinity,
            )
            if found is not None and found.reason is not Reason.NODE_CORDONED:
                return found
            problem = problem or found
        return problem

    def eligible(self, work: _Work, classes: Sequence[GPUClassView], names: Sequence[str]) -> Collection[str]:
        """Nodes that may take the set: eligible for every class and serving every needed name."""
        vmi = work.vmi
        plain = vmi is None or (not vmi.tolerations and not vmi.node_selector and vmi.node_affinity is None)
        if plain and len(classes) == 1:
            available = self.s.availability.get(classes[0].name)
            return available.node_free.keys() if available is not None else ()
        cache_key: tuple[object, ...] = (
            tuple(c.name for c in classes),
            tuple(vmi.tolerations) if vmi is not None else (),
            tuple(sorted(vmi.node_selector.items())) if vmi is not None else (),
            vmi.node_affinity if vmi is not None else None,
        )
        cached = self._eligible_cache.get(cache_key)
        if cached is not None:
            return cached
        candidates = set(self.s.serving.get(names[0], ())) if names else set()
        for name in names[1:]:
            candidates &= set(self.s.serving.get(name, ()))
        result = frozenset(n for n in candidates if self.node_problem(work, n, classes) is None)
        self._eligible_cache[cache_key] = result
        return result

    # -- choosing a node, else Lost --------------------------------------------

    def _demand(self, work: _Work) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """Units the set needs per resource name, and the units it already holds per node."""
        need: dict[str, int] = {}
        held_on: dict[str, dict[str, int]] = {}
        for device in work.members:
            name = self.resource(device)
            assert name is not None
            need[name] = need.get(name, 0) + device.count
            phase, node = self.where(device)
            if phase is Phase.BOUND and node:
                per = held_on.setdefault(node, {})
                per[name] = per.get(name, 0) + device.count
        return need, held_on

    def choose(self, work: _Work, *, exclude: Iterable[str] = (),
               only: str | None = None) -> tuple[str | None, Refusal | None]:
        """The node for the whole set (``only`` that one, when given), or why there is none."""
        classes = self.classes_of(work)
        if classes is None:
            missing = next(d.class_name for d in work.members if d.class_name not in self.s.classes)
            return None, refusals.unknown_class(missing)
        need, held_on = self._demand(work)
        names = sorted(need)
        skip = set(exclude)
        candidates = self.eligible(work, classes, names)
        if only is not None:
            if only not in candidates:
                problem = self.node_problem(work, only, classes)
                if problem is None:
                    missing = ", ".join(n for n in names if only not in self.s.serving.get(n, ()))
                    problem = refusals.no_node_for_set(work.label, needs=missing or ", ".join(names), candidates=0)
                return None, problem
            candidates = (only,)
        # Nothing held yet and a name no node has room for: no need to look.
        hopeless = not held_on and any(need[name] > self.max_free(name) for name in names)
        if not held_on and len(names) == 1 and not hopeless:  # a new set of one name: the room buckets
            node = self.fullest(names[0], need[names[0]], candidates, skip)
            best: tuple[int, int, str] | None = (0, 0, node) if node is not None else None
        else:
            best = None
        # The hot loop of a set that holds units already, or of several names: kept inline.
        for node in () if hopeless or (not held_on and len(names) == 1) else candidates:
            if node in skip:
                continue
            here = held_on.get(node)
            leftover = 0
            held_units = 0
            for name in names:
                already = here.get(name, 0) if here else 0
                room = self.free(node, name) - need[name] + already
                if room < 0:
                    break
                leftover += room
                held_units += already
            else:
                score = (-held_units, leftover, node)
                if best is None or score < best:
                    best = score
        if best is None:
            needs = ", ".join(f"{need[n]} of {n}" for n in names)
            return None, refusals.no_node_for_set(work.label, needs=needs, candidates=len(candidates))
        return best[2], None

    def destination(self, work: _Work, *, leaving: str | None = None, cause: Refusal | None = None) -> _Move | _Lost:
        """Choose a node, else Lost: the fullest node with room other than ``leaving``.

        ``cause`` is why the set leaves ``leaving`` (None for a gather or a
        rebind, where a Lost set is lost for want of room).
        """
        if _running(self.s, work):
            # R-BIND-7: a set whose VM runs may go to its launcher's node only (the member the VM uses is there).
            launcher = _launcher_node(self.s, work)
            if launcher is None:
                refused = refusals.vm_runs_on(work.label, node=None, why=None)
                return _Lost(cause=cause or refused, no_room=refused)
            only, why = self.choose(work, only=launcher)
            if only is not None:
                return _Move(node=only, cause=cause)
            refused = refusals.vm_runs_on(work.label, node=launcher, why=why)
            return _Lost(cause=cause or refused, no_room=refused)
        node, no_room = self.choose(work, exclude=(leaving,) if leaving else ())
        if node is not None:
            return _Move(node=node, cause=cause)
        assert no_room is not None
        return _Lost(cause=cause or no_room, no_room=no_room)

    def carry_out(self, work: _Work, decision: _Move | _Lost) -> None:
        """Write a move or a loss into the plan (a member already Lost stays so)."""
        if isinstance(decision, _Move):
            self.apply(work, decision.node, cause=decision.cause)
        else:
            self.send_to_lost(work, decision.cause)

    def apply(self, work: _Work, node: str, *, cause: Refusal | None = None) -> list[Bind]:
        moves: list[Bind] = []
        for device in work.members:
            phase, current = self.where(device)
            if phase is Phase.BOUND and current == node:
                continue
            name = self.resource(device)
            assert name is not None
            if phase is Phase.BOUND and current:
                self._book(current, name, -device.count)
            self._book(node, name, device.count)
            self.state[device.key] = (Phase.BOUND, node)
            moved_off = current if phase is Phase.BOUND else None
            bind = Bind(device=device.key, node=node, previous=moved_off, cause=cause if moved_off else None)
            moves.append(bind)
            self.actions.append(bind)
        return moves

    def send_to_lost(self, work: _Work, cause: Refusal) -> None:
        for device in work.members:
            phase, current = self.where(device)
            if phase is Phase.PENDING or phase is Phase.LOST:
                continue
            name = self.resource(device)
            if current and name is not None:
                self._book(current, name, -device.count)
            self.state[device.key] = (Phase.LOST, None)
            self.lost_now.add(device.key)
            self.actions.append(MarkLost(device=device.key, previous=current, cause=cause))

    def record_stay(self, work: _Work, node: str, decision: _Stay) -> Stay:
        """The Stay of a set kept on its cordoned node, written into the plan once."""
        devices = tuple(d.key for d in work.members)
        stay = self._stays.get(devices)
        if stay is None:
            stay = Stay(devices=devices, node=node, cause=decision.cause, why=decision.why)
            self._stays[devices] = stay
            self.actions.append(stay)
        return stay

    def stayed(self, work: _Work) -> _Stay | None:
        """The Stay this pass already decided for the set, if any."""
        stay = self._stays.get(tuple(d.key for d in work.members))
        return _Stay(cause=stay.cause, why=stay.why) if stay is not None else None

    # -- keep or move: the one rule ---------------------------------------------

    def node_rule(self, work: _Work, node: str, classes: Sequence[GPUClassView]) -> _Decision:
        """What the set's node itself decides (R-BIND-5, R-BIND-6): keep, stay on a cordon, move or Lost."""
        problem = self.node_problem(work, node, classes)
        if problem is None:
            return _KEEP
        if _running(self.s, work):
            return _Stay(cause=problem, why=VM_RUNS_THERE)
        if problem.reason is not Reason.NODE_CORDONED:
            return self.destination(work, leaving=node, cause=problem)
        if any(c.on_cordon is OnCordon.STAY for c in classes):
            return _Stay(cause=problem, why=ON_CORDON_STAY)
        decision = self.destination(work, leaving=node, cause=problem)
        if isinstance(decision, _Lost):
            return _Stay(cause=problem, why=NO_ROOM_ELSEWHERE)
        return decision

    def capacity_victims(self, node: str, kept: Sequence[_Work]) -> list[tuple[_Work, Refusal]]:
        """The capacity-lost rule: which of the sets ``kept`` on ``node`` leave it, and why.

        Per resource name (sorted) whose fresh report serves fewer units than
        are held and used: larger sets first, then by label, until what is
        left fits; a set whose VMI has a running launcher never leaves
        (R-BIND-7), so a node may stay over its capacity. A set leaving frees
        all its names. Nothing is written; the caller moves the sets in order.
        """
        entries = self.s.capacity.get(node, {})
        leaving: list[tuple[_Work, Refusal]] = []
        gone: set[int] = set()
        freed: dict[str, int] = {}
        for name in sorted(entries):
            entry = entries[name]
            deficit = -(self.kept(node, name) + freed.get(name, 0))
            if not entry.fresh or deficit <= 0:
                continue
            cause = refusals.capacity_lost(node, resource_name=name, served=entry.served, in_use=entry.served + deficit)
            holding = [
                (w, sum(d.count for d in w.members if self.resource(d) == name)) for w in kept if id(w) not in gone
            ]
            ranked = sorted(
                ((w, units) for w, units in holding if units > 0 and not _running(self.s, w)),
                key=lambda item: (-item[1], item[0].label),
            )
            for work, units in ranked:
                if deficit <= 0:
                    break
                leaving.append((work, cause))
                gone.add(id(work))
                for device in work.members:
                    held = self.resource(device)
                    if held is not None:
                        freed[held] = freed.get(held, 0) + device.count
                deficit -= units
        return leaving

    def keep_or_move(self, work: _Work, node: str, classes: Sequence[GPUClassView]) -> _Decision:
        """The one keep-or-move policy for a set held whole on ``node``: its node, then its node's capacity.

        A full pass applies the same two rules in two steps over every set
        (``_move_off``); this is the same decision for one set, as the
        answer path needs it.
        """
        decision = self.node_rule(work, node, classes)
        if isinstance(decision, _Keep | _Stay):
            cause = self._capacity_cause(work, node)
            if cause is not None:
                return self.destination(work, leaving=node, cause=cause)
        return decision

    def _capacity_cause(self, work: _Work, node: str) -> Refusal | None:
        """Why the capacity-lost rule takes this set off ``node``, if it does."""
        names = {self.resource(d) for d in work.members}
        if all(self.kept(node, name) >= 0 for name in names if name is not None):
            return None
        mine = {d.key for d in work.members}
        kept: list[_Work] = []
        for other in self.works():
            whole = self.held_part(other)
            if whole is None or self.held_node(whole) != node:
                continue
            classes = self.classes_of(whole)
            if classes is not None and isinstance(self.node_rule(whole, node, classes), _Keep | _Stay):
                kept.append(whole)
        for victim, cause in self.capacity_victims(node, kept):
            if mine & {d.key for d in victim.members}:
                return cause
        return None

    # -- the checks admission also makes -------------------------------------

    def order_problem(self, work: _Work, pending: Sequence[DeviceView]) -> Refusal | None:
        demand: dict[str, int] = {}
        namespace = pending[0].namespace
        for device in pending:
            gpu_class = self.s.classes.get(device.class_name)
            if gpu_class is None:
                return refusals.unknown_class(device.class_name)
            problem = class_problem(self.s, device.namespace, gpu_class) or count_problem(gpu_class, device.count)
            if problem is not None:
                return problem
            demand[device.class_name] = demand.get(device.class_name, 0) + device.count
        return self.budget.refusal(namespace, demand)

    def accept(self, pending: Sequence[DeviceView]) -> None:
        demand: dict[str, int] = {}
        for device in pending:
            demand[device.class_name] = demand.get(device.class_name, 0) + device.count
        if pending:
            self.budget.accept(pending[0].namespace, demand)

    # -- set states ------------------------------------------------------------

    def held_node(self, work: _Work) -> str | None:
        """The node every accepted member is Bound on, if the set is held whole on one node."""
        nodes = set()
        for device in work.members:
            phase, node = self.where(device)
            if phase is Phase.LOST:
                return None
            if phase is Phase.BOUND:
                nodes.add(node)
        return nodes.pop() if len(nodes) == 1 else None

    def split_while_running(self, whole: _Work) -> bool:
        """Whether the accepted members ``whole`` are split (over nodes, or partly Lost) while their VM runs."""
        return (len(whole.members) > 1 and len({self.where(d) for d in whole.members}) > 1
                and _running(self.s, whole))

    def held_part(self, work: _Work) -> _Work | None:
        """The set's accepted members (what it holds or lost) as a set of their own, None when there are none."""
        accepted = self.accepted(work)
        return _Work(label=work.label, vmi=work.vmi, members=accepted) if accepted else None

    def works(self) -> Sequence[_Work]:
        """Every set of the snapshot (built on first use: only the capacity-lost rule needs them all)."""
        if self._works is None:
            self._works = [_work(self.s, s) for s in device_sets(self.s)]
        return self._works

    def accepted(self, work: _Work) -> list[DeviceView]:
        return [d for d in work.members if self.where(d)[0] is not Phase.PENDING]

    def pending(self, work: _Work) -> list[DeviceView]:
        return [d for d in work.members if self.where(d)[0] is Phase.PENDING and not d.deleting]

    # -- placing a set with new members (answers, new orders, what-if) --------

    def place(self, work: _Work) -> SetPlacement:
        """Gather the whole set (held, Lost and new members) onto one node, or refuse.

        A set held whole on one node gets what :meth:`keep_or_move` decides for
        it with its new members: kept (new members join it there, or the
        whole set goes where they all fit), stayed on a cordon (new members
        join it there or are refused), moved, or refused when it would go Lost.
        """
        pending = self.pending(work)
        if pending:
            problem = self.order_problem(work, pending)
            if problem is not None:
                return SetPlacement(node=None, refusal=problem)
        members = self.accepted(work) + pending
        if not members:
            return SetPlacement(node=None, refusal=refusals.no_node_for_set(work.label, needs="nothing", candidates=0))
        target = _Work(label=work.label, vmi=work.vmi, members=members)
        held = self.held_node(target)
        classes = self.classes_of(target)
        if held is None or classes is None:
            going = self.destination(target)
            split = self.held_part(target)
            if isinstance(going, _Lost) and split is not None and self.split_while_running(split):
                # As the restore step leaves it (R-BIND-7): the answer carries the same Stay.
                node = _launcher_node(self.s, split) or ""
                stay = self.record_stay(split, node, _Stay(cause=going.no_room, why=SPLIT_WHILE_VM_RUNS))
                return SetPlacement(node=None, refusal=going.no_room, stay=stay)
            return self._settle(target, pending, going)
        held_part = self.held_part(target)
        assert held_part is not None
        decision = self.stayed(held_part) or self.keep_or_move(target, held, classes)
        if isinstance(decision, _Keep):
            if not pending:
                return SetPlacement(node=held, refusal=None)
            return self._settle(target, pending, self.destination(target))
        if isinstance(decision, _Stay):
            stay = self.record_stay(held_part, held, decision)
            problem = self._room_on(target, held)
            if problem is not None:
                return SetPlacement(node=None, refusal=problem, stay=stay)
            return self._commit(target, pending, held, cause=None, stay=stay)
        return self._settle(target, pending, decision)

    def _settle(self, work: _Work, pending: Sequence[DeviceView], decision: _Move | _Lost) -> SetPlacement:
        if isinstance(decision, _Lost):
            return SetPlacement(node=None, refusal=decision.no_room)
        return self._commit(work, pending, decision.node, cause=decision.cause)

    def _commit(
        self, work: _Work, pending: Sequence[DeviceView], node: str, *, cause: Refusal | None, stay: Stay | None = None
    ) -> SetPlacement:
        self.accept(pending)
        moves = self.apply(work, node, cause=cause)
        return SetPlacement(node=node, refusal=None, moves=tuple(moves), stay=stay)

    def _room_on(self, work: _Work, node: str) -> Refusal | None:
        """Why the members joining a set that stays on ``node`` do not fit there (None when they do).

        What the set holds there stays whatever the node's free units say:
        the capacity-lost rule has already decided it is not to leave.
        """
        need, held_on = self._demand(work)
        here = held_on.get(node, {})
        joining = {name: units - here.get(name, 0) for name, units in need.items() if units > here.get(name, 0)}
        if all(self.free(node, name) >= units for name, units in joining.items()):
            return None
        needs = ", ".join(f"{n} of {r}" for r, n in sorted(joining.items()))
        return refusals.no_node_for_set(work.label, needs=needs, candidates=1)


# ---------------------------------------------------------------------------
# The pass.


def _work(snapshot: Snapshot, device_set: DeviceSet) -> _Work:
    members = [snapshot.devices[k] for k in device_set.members]
    vmi = snapshot.vmis.get(device_set.vmi) if device_set.vmi is not None else None
    return _Work(label=device_set.label, vmi=vmi, members=members)


def _running(snapshot: Snapshot, work: _Work) -> bool:
    if work.vmi is None:
        return False
    return any((pod := snapshot.pods.get(uid)) is not None and not pod.final for uid in work.vmi.active_pods)


def _launcher_node(snapshot: Snapshot, work: _Work) -> str | None:
    """The node of the set's running launcher pod (the first by uid), None when it has none yet."""
    if work.vmi is None:
        return None
    for uid in sorted(work.vmi.active_pods):
        pod = snapshot.pods.get(uid)
        if pod is not None and not pod.final and pod.node_name:
            return pod.node_name
    return None


def plan_pass(snapshot: Snapshot, *, answers_only: bool = False) -> PassPlan:
    """Everything one binder pass decides, in the order of R-BIND-5 (or only the answers, R-BIND-3).

    The binder always plans the whole order, on the sets whose inputs changed
    (``cycle_view``); ``answers_only`` plans the answers alone, which the
    model's tests use to hold R-BIND-3's answer rules apart.
    """
    works = [_work(snapshot, s) for s in device_sets(snapshot)]
    planner = _Planner(snapshot, works)
    if not answers_only:
        _restore_sets(planner, works)
        _move_off(planner, works)
        _rebind_lost(planner, works)
    answered = _answer_requests(planner, works)
    if not answers_only:
        _bind_new_orders(planner, [w for w in works if id(w) not in answered])
    return PassPlan(actions=tuple(planner.actions))


def _restore_sets(planner: _Planner, works: Sequence[_Work]) -> None:
    """R-BIND-4: a set partly Lost or split over nodes is gathered onto one node or sent to Lost whole.

    R-BIND-7: a set whose VM runs is gathered onto its launcher's node only
    (``destination``), the members held there staying put; when that node
    cannot take the rest the set is left as it is, with a ``Stay`` saying why,
    and never sent to Lost.
    """
    for work in works:
        whole = planner.held_part(work)
        if whole is None or len(whole.members) < 2:
            continue
        if len({planner.where(d) for d in whole.members}) > 1:
            decision = planner.destination(whole)
            if isinstance(decision, _Lost) and planner.split_while_running(whole):
                node = _launcher_node(planner.s, whole) or ""
                planner.record_stay(whole, node, _Stay(cause=decision.no_room, why=SPLIT_WHILE_VM_RUNS))
                continue
            planner.carry_out(whole, decision)


def _move_off(planner: _Planner, works: Sequence[_Work]) -> None:
    """Move held sets off nodes that cannot keep them: the one rule of ``keep_or_move``, in two steps.

    First each set's node (``node_rule``), then, over the sets every node
    keeps, its capacity (``capacity_victims``), so that the sets moved off
    for a node problem are gone before a deficit is counted. A Stay is
    written only for a set still on its node after both.
    """
    kept: dict[str, list[_Work]] = {}
    stays: list[tuple[_Work, str, _Stay]] = []
    for work in works:
        whole = planner.held_part(work)
        node = planner.held_node(whole) if whole is not None else None
        classes = planner.classes_of(whole) if whole is not None else None
        if whole is None or node is None or classes is None:
            continue
        decision = planner.node_rule(whole, node, classes)
        if isinstance(decision, _Move | _Lost):
            planner.carry_out(whole, decision)
            continue
        kept.setdefault(node, []).append(whole)
        if isinstance(decision, _Stay):
            stays.append((whole, node, decision))
    for node in sorted(kept):
        for victim, cause in planner.capacity_victims(node, kept[node]):
            planner.carry_out(victim, planner.destination(victim, leaving=node, cause=cause))
    for whole, node, stay in stays:
        if planner.held_node(whole) == node:
            planner.record_stay(whole, node, stay)


def _rebind_lost(planner: _Planner, works: Sequence[_Work]) -> None:
    """A set wholly Lost (before this pass) is rebound on the fullest node with room; else it stays Lost."""
    for work in works:
        whole = planner.held_part(work)
        if whole is None or any(planner.where(d)[0] is not Phase.LOST for d in whole.members):
            continue
        if any(d.key in planner.lost_now for d in whole.members):
            continue
        planner.carry_out(whole, planner.destination(whole))


def _answer_requests(planner: _Planner, works: Sequence[_Work]) -> set[int]:
    answered: set[int] = set()
    for work in works:
        # A request unanswered on any member is answered on every member that carries it, so a set
        # whose answer was written half way (a crash between members) ends with one answer, not two.
        asked = {d.bind_request.id for d in work.members if d.unanswered_request and d.bind_request is not None}
        requests = [d for d in work.members if d.bind_request is not None and d.bind_request.id in asked]
        if not requests:
            continue
        answered.add(id(work))
        placement = planner.place(work)
        for device in requests:
            assert device.bind_request is not None
            planner.actions.append(
                Answer(
                    device=device.key,
                    request_id=device.bind_request.id,
                    result=SUCCEEDED if placement.refusal is None else FAILED,
                    node=placement.node,
                    refusal=placement.refusal,
                )
            )
        if placement.refusal is not None:
            for device in planner.pending(work):
                planner.actions.append(KeepPending(device=device.key, refusal=placement.refusal))
    return answered


def _bind_new_orders(planner: _Planner, works: Sequence[_Work]) -> None:
    waiting = [(w, planner.pending(w)) for w in works]
    ordered = sorted(
        ((w, p) for w, p in waiting if p),
        key=lambda item: (min((d.created.timestamp() if d.created else 0.0) for d in item[1]), item[0].label),
    )
    for work, pending in ordered:
        placement = planner.place(work)
        if placement.refusal is not None:
            for device in pending:
                planner.actions.append(KeepPending(device=device.key, refusal=placement.refusal))


def place_set(
    snapshot: Snapshot,
    members: Sequence[DeviceView],
    *,
    vmi: VMIView | None = None,
    label: str | None = None,
    count_pending: bool = False,
) -> SetPlacement:
    """Where this set would be placed now, or why not: the VMI webhook's dry check (R-ADM-2).

    ``members`` may include devices that do not exist yet (template devices
    about to be created, as Pending views). Nothing is written; the result
    is what an answer pass would decide on the same snapshot.

    ``count_pending`` (the admission check, R-MOD-4): budgets also count the
    tenant subtree's orders not yet accepted, as the GPUDevice webhook does
    (``catalog.order_refusal``), so a start cannot jump ahead of an earlier
    admitted order under the same budget; the set's own Pending members are
    counted once, as members, not again among those orders.
    """
    if not members:
        raise ValueError("a set has at least one member")
    first = members[0]
    name = label or (f"VMI {vmi.namespace}/{vmi.name}" if vmi else f"GPUDevice {first.namespace}/{first.name}")
    planner = _Planner(snapshot)
    if count_pending:
        planner.budget.extra = _pending_besides(snapshot, members)
    return planner.place(_Work(label=name, vmi=vmi, members=list(members)))


def _pending_besides(snapshot: Snapshot, members: Sequence[DeviceView]) -> dict[str, Usage]:
    """The subtrees' orders not yet accepted (R-MOD-4), less the set's own Pending members."""
    extra = dict(snapshot.pending_usage)
    for member in members:
        known = snapshot.devices.get(member.key)
        if known is None or known.accepted or known.deleting:
            continue
        own = demand_usage({known.class_name: known.count}, snapshot.classes)
        less = Usage(per_class={k: -n for k, n in own.per_class.items()}, total=-own.total,
                     raw={k: -n for k, n in own.raw.items()})
        for tenant in ancestry(known.namespace):
            if tenant in extra:
                extra[tenant] = add_usage(extra[tenant], less)
    return extra


def resulting_states(snapshot: Snapshot, plan: PassPlan) -> dict[DeviceKey, tuple[Phase, str | None]]:
    """Every device's (phase, node) after the plan's actions are written."""
    states = {k: (d.phase, d.node_name) for k, d in snapshot.devices.items()}
    for action in plan.actions:
        if isinstance(action, Bind):
            states[action.device] = (Phase.BOUND, action.node)
        elif isinstance(action, MarkLost):
            states[action.device] = (Phase.LOST, None)
    return states
