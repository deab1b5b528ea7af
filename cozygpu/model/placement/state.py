"""What one planning run has taken so far: where each device is, the units and budget booked, the plan written.

Why one place: every step of a pass reads the devices as the earlier steps
left them (``where``), and a Bind or a MarkLost books or frees its units as
it is written, so the phases, the units and the plan cannot drift apart. A
set is decided once a run: its Stay is written once and read back by later
steps (``stayed``).
"""

from __future__ import annotations

from collections.abc import Sequence

from cozygpu.model import refusals
from cozygpu.model.budgets import BudgetLedger
from cozygpu.model.placement.decisions import GoLost, Move, StayPut
from cozygpu.model.placement.plan import Action, Bind, MarkLost, Stay
from cozygpu.model.placement.sets import Work, running
from cozygpu.model.placement.units import Units
from cozygpu.model.refusals import Refusal
from cozygpu.model.snapshot import DeviceKey, DeviceView, Phase, Snapshot


class CycleState:
    """The mutable scratch state of one planning run over a snapshot, local to one call."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.s = snapshot
        #: Devices this run bound or sent to Lost: (phase, node) as the plan leaves them.
        self.phases: dict[DeviceKey, tuple[Phase, str | None]] = {}
        self.units = Units(snapshot)
        self.budget = BudgetLedger(snapshot)
        self.actions: list[Action] = []
        self.lost_now: set[DeviceKey] = set()
        #: Stays written in this pass, by their devices: a set is decided once a pass.
        self._stays: dict[tuple[DeviceKey, ...], Stay] = {}

    def where(self, device: DeviceView) -> tuple[Phase, str | None]:
        return self.phases.get(device.key, (device.phase, device.node_name))

    def resource(self, device: DeviceView) -> str | None:
        gpu_class = self.s.classes.get(device.class_name)
        return gpu_class.resource_name if gpu_class is not None else None

    # -- writing the plan --------------------------------------------------------

    def carry_out(self, work: Work, decision: Move | GoLost) -> list[Bind]:
        """Write a move or a loss into the plan (a member already Lost stays so); the Binds of a move, the
        stopped holds a compaction moves first among them."""
        if isinstance(decision, Move):
            return [*self.make_room(work, decision), *self.apply(work, decision.node, cause=decision.cause)]
        self.send_to_lost(work, decision.cause)
        return []

    def make_room(self, work: Work, decision: Move) -> list[Bind]:
        """The compaction's moves of a Move (R-BIND-11), each a Bind whose cause names the set it made room for."""
        plan = decision.compaction
        if plan is None:
            return []
        need = sum(device.count for device in work.members)
        cause = refusals.compaction(work.label, node=plan.node, needs=need, moves=len(plan.moves))
        moved: list[Bind] = []
        devices = self.s.every_device if self.s.every_device is not None else self.s.devices
        for move in plan.moves:
            device = devices[move.device]
            moved += self.apply(Work(label=f"GPUDevice {device.namespace}/{device.name}", vmi=None, members=[device]),
                                move.target, cause=cause)
        return moved

    def apply(self, work: Work, node: str, *, cause: Refusal | None = None) -> list[Bind]:
        moves: list[Bind] = []
        for device in work.members:
            phase, current = self.where(device)
            if phase is Phase.BOUND and current == node:
                continue
            name = self.resource(device)
            assert name is not None
            if phase is Phase.BOUND and current:
                self.units.book(current, name, -device.count)
            self.units.book(node, name, device.count)
            self.phases[device.key] = (Phase.BOUND, node)
            moved_off = current if phase is Phase.BOUND else None
            bind = Bind(device=device.key, node=node, previous=moved_off, cause=cause if moved_off else None)
            moves.append(bind)
            self.actions.append(bind)
        return moves

    def send_to_lost(self, work: Work, cause: Refusal) -> None:
        for device in work.members:
            phase, current = self.where(device)
            if phase is Phase.PENDING or phase is Phase.LOST:
                continue
            name = self.resource(device)
            if current and name is not None:
                self.units.book(current, name, -device.count)
            self.phases[device.key] = (Phase.LOST, None)
            self.lost_now.add(device.key)
            self.actions.append(MarkLost(device=device.key, previous=current, cause=cause))

    def record_stay(self, work: Work, node: str, decision: StayPut) -> Stay:
        """The Stay of a set kept on its node, written into the plan once."""
        devices = tuple(d.key for d in work.members)
        stay = self._stays.get(devices)
        if stay is None:
            stay = Stay(devices=devices, node=node, cause=decision.cause, why=decision.why)
            self._stays[devices] = stay
            self.actions.append(stay)
        return stay

    def stayed(self, work: Work) -> StayPut | None:
        """The Stay this pass already decided for the set, if any."""
        stay = self._stays.get(tuple(d.key for d in work.members))
        return StayPut(cause=stay.cause, why=stay.why) if stay is not None else None

    def accept(self, pending: Sequence[DeviceView]) -> None:
        """Book the budgets of orders this run accepts, so later orders see them (R-BIND-6)."""
        demand: dict[str, int] = {}
        for device in pending:
            demand[device.class_name] = demand.get(device.class_name, 0) + device.count
        if pending:
            self.budget.accept(pending[0].namespace, demand)

    # -- set states --------------------------------------------------------------

    def held_node(self, work: Work) -> str | None:
        """The node every accepted member is Bound on, if the set is held whole on one node."""
        nodes = set()
        for device in work.members:
            phase, node = self.where(device)
            if phase is Phase.LOST:
                return None
            if phase is Phase.BOUND:
                nodes.add(node)
        return nodes.pop() if len(nodes) == 1 else None

    def split_while_running(self, whole: Work) -> bool:
        """Whether the accepted members ``whole`` are split (over nodes, or partly Lost) while their VM runs."""
        return (len(whole.members) > 1 and len({self.where(d) for d in whole.members}) > 1
                and running(self.s, whole))

    def held_part(self, work: Work) -> Work | None:
        """The set's accepted members (what it holds or lost) as a set of their own, None when there are none."""
        accepted = self.accepted(work)
        return Work(label=work.label, vmi=work.vmi, members=accepted) if accepted else None

    def accepted(self, work: Work) -> list[DeviceView]:
        return [d for d in work.members if self.where(d)[0] is not Phase.PENDING]

    def pending(self, work: Work) -> list[DeviceView]:
        return [d for d in work.members if self.where(d)[0] is Phase.PENDING and not d.deleting]
