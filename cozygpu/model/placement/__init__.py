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

Modules, as kube-scheduler splits its scheduling cycle:

- ``plan``: the plan's values (Bind, MarkLost, KeepPending, Stay, Answer,
  PassPlan, SetPlacement).
- ``sets``: grouping devices into sets, and whether a set's VM runs.
- ``decisions``: keep, stay, move or Lost, and a Stay's reasons.
- ``units``: the units a run books on top of the snapshot's room, and the
  fullest node with room from the room buckets.
- ``state``: what a run has taken so far (phases, units, budgets, the plan).
- ``nodes``: which nodes may take a set (filter).
- ``choice``: where a set goes, ``destination`` (score, else Lost).
- ``rules``: whether a held set keeps its node, ``keep_or_move``.
- ``planner``: one run's pieces together, and placing a set with new
  members (answers, new orders, the webhook's ``place_set``) after the
  admission re-checks.
- ``cycle``: the steps of a pass, ``plan_pass``, and ``resulting_states``.
"""

from cozygpu.model.placement.cycle import plan_pass, resulting_states
from cozygpu.model.placement.decisions import NO_ROOM_ELSEWHERE, ON_CORDON_STAY, SPLIT_WHILE_VM_RUNS, VM_RUNS_THERE
from cozygpu.model.placement.plan import (
    FAILED,
    SUCCEEDED,
    Action,
    Answer,
    Bind,
    KeepPending,
    MarkLost,
    PassPlan,
    SetPlacement,
    Stay,
)
from cozygpu.model.placement.planner import OrderCheck, order_check, place_set
from cozygpu.model.placement.planner import Planner as _Planner
from cozygpu.model.placement.sets import DeviceSet, device_sets

__all__ = [
    "FAILED",
    "NO_ROOM_ELSEWHERE",
    "ON_CORDON_STAY",
    "SPLIT_WHILE_VM_RUNS",
    "SUCCEEDED",
    "VM_RUNS_THERE",
    "Action",
    "Answer",
    "Bind",
    "DeviceSet",
    "KeepPending",
    "MarkLost",
    "OrderCheck",
    "PassPlan",
    "SetPlacement",
    "Stay",
    "_Planner",  # one planning run: the property tests reach its booked units through it
    "device_sets",
    "order_check",
    "place_set",
    "plan_pass",
    "resulting_states",
]
