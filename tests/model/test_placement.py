from __future__ import annotations

from datetime import timedelta

import attrs

from cozygpu.model.placement import (
    FAILED,
    SPLIT_WHILE_VM_RUNS,
    SUCCEEDED,
    VM_RUNS_THERE,
    Answer,
    Bind,
    KeepPending,
    MarkLost,
    PassPlan,
    Stay,
    device_sets,
    place_set,
    plan_pass,
    resulting_states,
)
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import (
    BindAnswer,
    NodeSelectorTerm,
    OnCordon,
    Phase,
    PodPhase,
    SelectorRequirement,
    Taint,
    Toleration,
)
from tests.model.factories import H100, NOW, device, gpu_class, gpu_nodes, inventory, node, pod, snapshot, vmi


def binds(plan: PassPlan) -> dict[tuple[str, str], str]:
    return {a.device: a.node for a in plan.of(Bind)}


def test_a_new_order_goes_to_the_fullest_node_with_room() -> None:
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 4), ("n3", 2))
    snap = snapshot(
        nodes=nodes,
        inventories=inventories,
        devices=[device("held", count=1, phase=Phase.BOUND, node="n2"), device("new", count=2)],
    )
    assert binds(plan_pass(snap)) == {("tenant-a", "new"): "n3"}


def test_nodes_equally_full_are_chosen_by_name() -> None:
    nodes, inventories = gpu_nodes(("n2", 4), ("n1", 4))
    snap = snapshot(nodes=nodes, inventories=inventories, devices=[device("new", count=1)])
    assert binds(plan_pass(snap)) == {("tenant-a", "new"): "n1"}


def test_new_orders_are_placed_oldest_first_and_the_rest_wait_with_a_reason() -> None:
    snap = snapshot(
        devices=[
            device("young", count=6, created=NOW),
            device("old", count=6, created=NOW - timedelta(minutes=1)),
        ]
    )
    plan = plan_pass(snap)
    assert binds(plan) == {("tenant-a", "old"): "n1"}
    (waiting,) = plan.of(KeepPending)
    assert waiting.device == ("tenant-a", "young")
    assert waiting.refusal.reason is Reason.NO_NODE_WITH_ROOM


def test_the_binder_rechecks_budgets_so_two_orders_cannot_race_past_one() -> None:
    snap = snapshot(
        devices=[device("first", count=2, created=NOW - timedelta(seconds=2)), device("second", count=2, created=NOW)],
        quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "3"}},
    )
    plan = plan_pass(snap)
    assert binds(plan) == {("tenant-a", "first"): "n1"}
    (waiting,) = plan.of(KeepPending)
    assert waiting.refusal.reason is Reason.BUDGET_EXCEEDED


def test_a_split_set_is_gathered_onto_the_node_that_holds_most_of_it() -> None:
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 8))
    snap = snapshot(
        nodes=nodes,
        inventories=inventories,
        devices=[
            device("big", count=3, phase=Phase.BOUND, node="n2", vmi="vm1"),
            device("small", count=1, phase=Phase.BOUND, node="n1", vmi="vm1"),
        ],
    )
    assert binds(plan_pass(snap)) == {("tenant-a", "small"): "n2"}


def test_a_split_set_with_no_node_to_gather_on_goes_lost_as_a_whole() -> None:
    nodes, inventories = gpu_nodes(("n1", 2), ("n2", 2))
    snap = snapshot(
        nodes=nodes,
        inventories=inventories,
        devices=[
            device("a", count=2, phase=Phase.BOUND, node="n1", vmi="vm1"),
            device("b", count=2, phase=Phase.BOUND, node="n2", vmi="vm1"),
        ],
    )
    plan = plan_pass(snap)
    lost = {a.device for a in plan.of(MarkLost)}
    assert lost == {("tenant-a", "a"), ("tenant-a", "b")}


def test_a_start_that_cannot_gather_its_set_is_refused_and_its_holds_stay_where_they_are() -> None:
    """The chaos test's breach: a start attached holds on two nodes, the room to gather them went to other
    orders meanwhile, and the pass sent both holds Lost (then rebound them elsewhere) for a VM that never
    ran. The answer refuses the start (R-BIND-6); the holds stay, Bound where they were."""
    nodes, inventories = gpu_nodes(("n1", 2), ("n2", 2))
    asked = [attrs.evolve(d, attachment=attrs.evolve(d.attachment, request_id="r1"))
             for d in (device("a", count=2, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1"),
                       device("b", count=2, phase=Phase.BOUND, node="n2", vmi="vm1", request="r1"))
             if d.attachment is not None]
    plan = plan_pass(snapshot(nodes=nodes, inventories=inventories, devices=asked))
    assert plan.of(MarkLost) == ()
    assert plan.of(Bind) == ()
    assert {(a.device[1], a.result) for a in plan.of(Answer)} == {("a", FAILED), ("b", FAILED)}
    # The answers written, the webhook has not taken the attachments back yet: the next pass moves nothing.
    refused = [attrs.evolve(d, bind_answer=BindAnswer(id="r1", result=FAILED)) for d in asked]
    again = plan_pass(snapshot(nodes=nodes, inventories=inventories, devices=refused))
    assert again.of(MarkLost) == ()
    assert again.of(Bind) == ()


def test_a_split_set_whose_vm_runs_is_gathered_onto_the_launchers_node_not_where_most_of_it_is() -> None:
    # Unlike an idle set (gathered onto n2, which holds most of it), the member the running VM uses stays on n1.
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 8))
    snap = snapshot(
        nodes=nodes,
        inventories=inventories,
        devices=[
            device("big", count=3, phase=Phase.BOUND, node="n2", vmi="vm1"),
            device("small", count=1, phase=Phase.BOUND, node="n1", vmi="vm1"),
        ],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", node_name="n1", requests={H100: 1})],
    )
    plan = plan_pass(snap)
    assert binds(plan) == {("tenant-a", "big"): "n1"}
    assert not plan.of(MarkLost)


def test_a_split_set_whose_vm_runs_is_left_split_with_a_stay_when_the_launchers_node_has_no_room() -> None:
    # Room for the whole set on n3, none on n1 where the VM runs: nothing moves, nothing goes Lost.
    nodes, inventories = gpu_nodes(("n1", 2), ("n2", 2), ("n3", 8))
    snap = snapshot(
        nodes=nodes,
        inventories=inventories,
        devices=[
            device("a", count=2, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1"),
            device("b", count=2, phase=Phase.BOUND, node="n2", vmi="vm1"),
            device("c", count=1, phase=Phase.LOST, vmi="vm1"),
        ],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", node_name="n1", requests={H100: 2})],
    )
    plan = plan_pass(snap)
    assert not plan.of(Bind)
    assert not plan.of(MarkLost)
    (stay,) = plan.of(Stay)
    assert (stay.node, stay.why) == ("n1", SPLIT_WHILE_VM_RUNS)
    assert set(stay.devices) == {("tenant-a", "a"), ("tenant-a", "b"), ("tenant-a", "c")}
    assert "node n1" in stay.cause.message
    (answer,) = plan.of(Answer)
    assert answer.result == FAILED
    assert answer.refusal is not None
    assert "its VM runs on node n1" in answer.refusal.message
    # The answer path alone refuses it the same way and moves nothing.
    alone = plan_pass(snap, answers_only=True)
    assert not alone.of(Bind)
    assert not alone.of(MarkLost)
    assert [a.result for a in alone.of(Answer)] == [FAILED]


def test_a_split_set_whose_launcher_has_no_node_yet_is_left_as_it_is() -> None:
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 8))
    snap = snapshot(
        nodes=nodes,
        inventories=inventories,
        devices=[
            device("a", count=1, phase=Phase.BOUND, node="n1", vmi="vm1"),
            device("b", count=1, phase=Phase.BOUND, node="n2", vmi="vm1"),
        ],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", node_name=None, requests={H100: 2})],
    )
    plan = plan_pass(snap)
    assert not plan.of(Bind)
    assert not plan.of(MarkLost)
    assert [s.why for s in plan.of(Stay)] == [SPLIT_WHILE_VM_RUNS]


def test_a_set_left_partly_lost_is_gathered_where_its_held_members_are() -> None:
    snap = snapshot(
        devices=[
            device("held", count=1, phase=Phase.BOUND, node="n1", vmi="vm1"),
            device("lost", count=1, phase=Phase.LOST, vmi="vm1"),
        ]
    )
    assert binds(plan_pass(snap)) == {("tenant-a", "lost"): "n1"}


def test_a_set_moves_off_a_node_that_is_not_ready() -> None:
    snap = snapshot(
        nodes=[node("n1", ready=False), node("n2")],
        inventories=[inventory("n1"), inventory("n2")],
        devices=[device("d", count=2, phase=Phase.BOUND, node="n1")],
    )
    plan = plan_pass(snap)
    (move,) = plan.of(Bind)
    assert (move.node, move.previous) == ("n2", "n1")
    assert move.cause is not None
    assert move.cause.reason is Reason.NODE_NOT_READY


def test_a_set_whose_node_is_gone_and_that_no_node_can_take_goes_lost() -> None:
    snap = snapshot(nodes=[], inventories=[], devices=[device("d", count=2, phase=Phase.BOUND, node="gone")])
    (lost,) = plan_pass(snap).of(MarkLost)
    assert lost.cause.reason is Reason.NODE_GONE


def test_a_cordoned_set_moves_when_another_node_has_room() -> None:
    snap = snapshot(
        nodes=[node("n1", unschedulable=True), node("n2")],
        inventories=[inventory("n1"), inventory("n2")],
        devices=[device("d", count=2, phase=Phase.BOUND, node="n1")],
    )
    assert binds(plan_pass(snap)) == {("tenant-a", "d"): "n2"}


def test_a_cordon_alone_does_not_move_a_set_with_no_room_elsewhere() -> None:
    snap = snapshot(
        nodes=[node("n1", unschedulable=True), node("n2")],
        inventories=[inventory("n1"), inventory("n2", {H100: 1})],
        devices=[device("d", count=2, phase=Phase.BOUND, node="n1")],
    )
    plan = plan_pass(snap)
    assert binds(plan) == {}
    assert not plan.of(MarkLost)
    (stay,) = plan.of(Stay)
    assert stay.why == "no other node has room"


def test_a_class_with_on_cordon_stay_keeps_its_node_even_with_room_elsewhere() -> None:
    snap = snapshot(
        classes=[gpu_class(on_cordon=OnCordon.STAY)],
        nodes=[node("n1", unschedulable=True), node("n2")],
        inventories=[inventory("n1"), inventory("n2")],
        devices=[device("d", count=2, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1")],
    )
    plan = plan_pass(snap)
    assert binds(plan) == {}
    (answer,) = plan.of(Answer)
    assert (answer.result, answer.node) == (SUCCEEDED, "n1")
    (stay,) = plan.of(Stay)
    assert (stay.node, stay.why) == ("n1", "onCordon: Stay")


def test_an_answer_pass_says_a_set_stays_on_its_cordoned_node_as_a_full_pass_does() -> None:
    snap = snapshot(
        nodes=[node("n1", unschedulable=True), node("n2")],
        inventories=[inventory("n1"), inventory("n2", {H100: 1})],
        devices=[device("d", count=2, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1")],
        vmis=[vmi("vm1")],
    )
    full, answers = plan_pass(snap), plan_pass(snap, answers_only=True)
    assert [(s.node, s.why) for s in answers.of(Stay)] == [("n1", "no other node has room")]
    assert answers.of(Stay) == full.of(Stay)
    assert answers.of(Answer) == full.of(Answer)
    dry = place_set(snap, [snap.devices[("tenant-a", "d")]], vmi=snap.vmis[("tenant-a", "vm1")])
    assert (dry.node, dry.refusal, dry.stay) == ("n1", None, full.of(Stay)[0])


def test_a_move_an_answer_makes_off_a_cordoned_node_says_it_was_the_cordon() -> None:
    snap = snapshot(
        nodes=[node("n1", unschedulable=True), node("n2")],
        inventories=[inventory("n1"), inventory("n2")],
        devices=[device("d", count=2, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1")],
    )
    (move,) = plan_pass(snap, answers_only=True).of(Bind)
    assert (move.node, move.previous) == ("n2", "n1")
    assert move.cause is not None
    assert move.cause.reason is Reason.NODE_CORDONED


def test_an_answer_on_a_node_that_lost_capacity_keeps_a_set_the_capacity_rule_keeps() -> None:
    # n1 serves one unit for two held sets: the full pass moves the idle one and keeps the running VM,
    # so a request of the running VM is answered where it is, by either pass.
    snap = snapshot(
        nodes=[node("n1"), node("n2")],
        inventories=[inventory("n1", {H100: 1}), inventory("n2", {H100: 1})],
        devices=[
            device("running", count=1, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1"),
            device("idle", count=1, phase=Phase.BOUND, node="n1"),
        ],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", node_name="n1", requests={H100: 1})],
    )
    full, answers = plan_pass(snap), plan_pass(snap, answers_only=True)
    assert binds(full) == {("tenant-a", "idle"): "n2"}
    assert binds(answers) == {}
    assert [(a.result, a.node) for a in answers.of(Answer)] == [(SUCCEEDED, "n1")]
    assert answers.of(Answer) == full.of(Answer)


def test_a_set_the_capacity_rule_takes_off_a_cordoned_node_goes_lost_and_is_not_said_to_stay() -> None:
    snap = snapshot(
        classes=[gpu_class(on_cordon=OnCordon.STAY)],
        nodes=[node("n1", unschedulable=True)],
        inventories=[inventory("n1", {H100: 1})],
        devices=[device("d", count=2, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1")],
    )
    full, answers = plan_pass(snap), plan_pass(snap, answers_only=True)
    assert not full.of(Stay)
    (lost,) = full.of(MarkLost)
    assert lost.cause.reason is Reason.CAPACITY_LOST
    assert [a.result for a in answers.of(Answer)] == [FAILED]
    assert answers.of(Answer) == full.of(Answer)


def test_a_held_set_on_a_node_with_a_stale_report_is_not_moved() -> None:
    stale = inventory("n1", last_report=NOW - timedelta(hours=2))
    snap = snapshot(
        nodes=[node("n1"), node("n2")],
        inventories=[stale, inventory("n2")],
        devices=[device("d", count=2, phase=Phase.BOUND, node="n1"), device("new", count=1)],
    )
    assert binds(plan_pass(snap)) == {("tenant-a", "new"): "n2"}


def test_lost_capacity_moves_sets_without_a_running_launcher_first() -> None:
    snap = snapshot(
        nodes=[node("n1"), node("n2")],
        inventories=[inventory("n1", {H100: 1}), inventory("n2", {H100: 1})],
        devices=[
            device("running", count=1, phase=Phase.BOUND, node="n1", vmi="vm1"),
            device("idle", count=1, phase=Phase.BOUND, node="n1"),
            device("idle2", count=1, phase=Phase.BOUND, node="n1"),
        ],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", node_name="n1", requests={H100: 1})],
    )
    plan = plan_pass(snap)
    assert binds(plan) == {("tenant-a", "idle"): "n2"}
    (lost,) = plan.of(MarkLost)
    assert lost.device == ("tenant-a", "idle2")
    assert lost.cause.reason is Reason.CAPACITY_LOST


def test_a_set_whose_vm_runs_keeps_its_not_ready_node_and_an_idle_set_there_moves() -> None:
    snap = snapshot(
        nodes=[node("n1", ready=False), node("n2")],
        inventories=[inventory("n1", {H100: 2}), inventory("n2", {H100: 2})],
        devices=[
            device("running", count=1, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1"),
            device("idle", count=1, phase=Phase.BOUND, node="n1"),
        ],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", node_name="n1", requests={H100: 1})],
    )
    full, answers = plan_pass(snap), plan_pass(snap, answers_only=True)
    assert binds(full) == {("tenant-a", "idle"): "n2"}
    (stay,) = full.of(Stay)
    assert (stay.devices, stay.node, stay.why) == ((("tenant-a", "running"),), "n1", VM_RUNS_THERE)
    assert stay.cause.reason is Reason.NODE_NOT_READY
    assert [(a.result, a.node) for a in answers.of(Answer)] == [(SUCCEEDED, "n1")]
    assert answers.of(Answer) == full.of(Answer)


def test_a_set_whose_vm_runs_is_not_sent_to_lost_even_without_room_or_capacity() -> None:
    snap = snapshot(
        nodes=[node("n1", ready=False), node("n2", ready=False)],
        inventories=[inventory("n1", {H100: 1})],
        devices=[device("running", count=2, phase=Phase.BOUND, node="n1", vmi="vm1")],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", node_name="n1", requests={H100: 2})],
    )
    plan = plan_pass(snap)
    assert not plan.of(Bind)
    assert not plan.of(MarkLost)
    assert [s.why for s in plan.of(Stay)] == [VM_RUNS_THERE]


def test_once_the_launcher_has_finished_the_set_leaves_the_not_ready_node() -> None:
    snap = snapshot(
        nodes=[node("n1", ready=False), node("n2")],
        inventories=[inventory("n1"), inventory("n2")],
        devices=[device("d", count=1, phase=Phase.BOUND, node="n1", vmi="vm1")],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", node_name="n1", requests={H100: 1}, phase=PodPhase.FAILED)],
    )
    assert binds(plan_pass(snap)) == {("tenant-a", "d"): "n2"}


def test_a_vmis_set_goes_only_where_its_required_node_affinity_lets_the_launcher_run() -> None:
    far = NodeSelectorTerm(match_expressions=(SelectorRequirement(key="zone", operator="In", values=("b",)),))
    snap = snapshot(
        nodes=[node("n1", labels={"zone": "a"}), node("n2", labels={"zone": "b"})],
        inventories=[inventory("n1", {H100: 1}), inventory("n2", {H100: 8})],
        devices=[device("d", count=1, vmi="vm1", request="r1")],
        vmis=[vmi("vm1", node_affinity=(far,))],
    )
    assert binds(plan_pass(snap)) == {("tenant-a", "d"): "n2"}  # n1 is fuller, but the launcher cannot run there
    held = snapshot(
        nodes=[node("n1", labels={"zone": "a"}), node("n2", labels={"zone": "b"})],
        inventories=[inventory("n1", {H100: 1}), inventory("n2", {H100: 8})],
        devices=[device("d", count=1, phase=Phase.BOUND, node="n1", vmi="vm1")],
        vmis=[vmi("vm1", node_affinity=(far,))],
    )
    (move,) = plan_pass(held).of(Bind)
    assert (move.node, move.previous) == ("n2", "n1")
    assert move.cause is not None
    assert "required node affinity" in move.cause.message


def test_a_lost_set_is_rebound_once_a_node_has_room() -> None:
    snap = snapshot(devices=[device("d", count=3, phase=Phase.LOST, vmi="vm1")])
    assert binds(plan_pass(snap)) == {("tenant-a", "d"): "n1"}


def test_a_bind_request_is_answered_with_the_node_of_the_gathered_set() -> None:
    nodes, inventories = gpu_nodes(("n1", 2), ("n2", 8))
    snap = snapshot(
        nodes=nodes,
        inventories=inventories,
        devices=[
            device("held", count=1, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1"),
            device("vm1-gpu", count=2, vmi="vm1", request="r1"),
        ],
    )
    plan = plan_pass(snap)
    assert binds(plan) == {("tenant-a", "held"): "n2", ("tenant-a", "vm1-gpu"): "n2"}
    answers = plan.of(Answer)
    assert {(a.device[1], a.result, a.node) for a in answers} == {
        ("held", SUCCEEDED, "n2"),
        ("vm1-gpu", SUCCEEDED, "n2"),
    }


def test_a_refused_request_is_answered_failed_with_the_reason_and_moves_nothing() -> None:
    snap = snapshot(
        devices=[
            device("held", count=4, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1"),
            device("vm1-gpu", count=5, vmi="vm1", request="r1"),
        ],
    )
    plan = plan_pass(snap)
    assert binds(plan) == {}
    answers = plan.of(Answer)
    assert {a.result for a in answers} == {FAILED}
    assert all(a.refusal is not None and a.refusal.reason is Reason.NO_NODE_WITH_ROOM for a in answers)
    assert answers[0].refusal is not None
    assert (
        answers[0].refusal.message == f"VMI tenant-a/vm1: no eligible node has room for 9 of {H100} (1 node considered)"
    )


def test_an_answer_pass_answers_requests_and_leaves_everything_else_alone() -> None:
    snap = snapshot(
        nodes=[node("n1"), node("n2", ready=False)],
        inventories=[inventory("n1"), inventory("n2")],
        devices=[
            device("on-bad-node", count=1, phase=Phase.BOUND, node="n2"),
            device("order", count=1),
            device("vm1-gpu", count=1, vmi="vm1", request="r1"),
        ],
    )
    plan = plan_pass(snap, answers_only=True)
    assert binds(plan) == {("tenant-a", "vm1-gpu"): "n1"}
    assert len(plan.of(Answer)) == 1


def test_an_already_answered_request_is_not_answered_again() -> None:
    asked = device("d", count=1, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1")
    answered = attrs.evolve(asked, bind_answer=BindAnswer(id="r1", result=SUCCEEDED))
    assert not plan_pass(snapshot(devices=[answered])).of(Answer)


def test_vmi_tolerations_let_its_set_onto_a_tainted_node() -> None:
    taint = Taint(key="dedicated", value="gpu", effect="NoSchedule")
    snap = snapshot(
        nodes=[node("n1", taints=(taint,))],
        inventories=[inventory("n1")],
        devices=[device("vm1-gpu", count=1, vmi="vm1", request="r1"), device("plain", count=1)],
        vmis=[vmi("vm1", tolerations=(Toleration(key="dedicated", operator="Exists"),))],
    )
    plan = plan_pass(snap)
    assert binds(plan) == {("tenant-a", "vm1-gpu"): "n1"}
    (waiting,) = plan.of(KeepPending)
    assert waiting.device == ("tenant-a", "plain")


def test_the_webhooks_dry_check_places_devices_that_do_not_exist_yet() -> None:
    snap = snapshot(devices=[device("held", count=3, phase=Phase.BOUND, node="n1")])
    fits = place_set(snap, [snap.devices[("tenant-a", "held")], device("vm1-gpu", count=5)], vmi=vmi("vm1"))
    assert (fits.node, fits.refusal) == ("n1", None)
    refused = place_set(snap, [snap.devices[("tenant-a", "held")], device("vm1-gpu", count=6)], vmi=vmi("vm1"))
    assert refused.node is None
    assert refused.refusal is not None
    assert refused.refusal.subject == "VMI tenant-a/vm1"


def test_sets_group_the_devices_attached_to_one_vmi() -> None:
    snap = snapshot(devices=[device("a", vmi="vm1"), device("b", vmi="vm1"), device("c")])
    assert {s.members for s in device_sets(snap)} == {(("tenant-a", "a"), ("tenant-a", "b")), (("tenant-a", "c"),)}


def test_resulting_states_apply_binds_and_losses() -> None:
    snap = snapshot(devices=[device("new", count=1)])
    assert resulting_states(snap, plan_pass(snap))[("tenant-a", "new")] == (Phase.BOUND, "n1")


def test_a_device_left_attached_to_an_earlier_vmi_of_the_same_name_is_still_moved_off_a_gone_node() -> None:
    # vm1 was deleted and created again (a new UID); a device still attached to the old one
    # belongs to no set of the new VMI, but it is still planned, as a set of its own.
    nodes, inventories = gpu_nodes(("n1", 8))
    stale = device("old", phase=Phase.BOUND, node="gone", vmi="vm1", vmi_uid="uid-old")
    snap = snapshot(nodes=nodes, inventories=inventories, devices=[stale], vmis=[vmi("vm1", uid="uid-new")])
    assert binds(plan_pass(snap)) == {("tenant-a", "old"): "n1"}
    (alone,) = [s for s in device_sets(snap) if ("tenant-a", "old") in s.members]
    assert alone.vmi is None


def test_new_orders_go_onto_the_fullest_node_with_room_after_the_answers_and_not_in_an_answers_only_plan() -> None:
    nodes, inventories = gpu_nodes(("n1", 8), ("n2", 2))
    snap = snapshot(
        nodes=nodes,
        inventories=inventories,
        devices=[
            device("asks", count=1, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1"),
            device("new", count=2, created=NOW),
            device("newer", count=1, created=NOW + timedelta(seconds=1)),
        ],
    )
    assert binds(plan_pass(snap)) == {("tenant-a", "new"): "n2", ("tenant-a", "newer"): "n1"}
    assert binds(plan_pass(snap, answers_only=True)) == {}


def test_a_request_answered_on_one_member_only_is_answered_again_on_every_member() -> None:
    # A crash between the members' writes: one member moved and answered, the other neither.
    nodes, inventories = gpu_nodes(("n1", 2), ("n3", 1))
    answered = attrs.evolve(
        device("moved", count=1, phase=Phase.BOUND, node="n3", vmi="vm1", request="r1"),
        bind_answer=BindAnswer(id="r1", result=SUCCEEDED, node="n3"),
    )
    left = device("left", count=1, phase=Phase.BOUND, node="n1", vmi="vm1", request="r1")
    snap = snapshot(nodes=nodes, inventories=inventories, devices=[answered, left])
    for plan in (plan_pass(snap), plan_pass(snap, answers_only=True)):
        answers = {a.device[1]: (a.request_id, a.result, a.node) for a in plan.of(Answer)}
        assert set(answers) == {"moved", "left"}
        assert len(set(answers.values())) == 1, answers
