"""Toleration matching and node eligibility, with the examples of the Kubernetes taints documentation."""

from __future__ import annotations

import pytest

from cozygpu.model.eligibility import (
    affinity_matches,
    node_problem,
    selector_matches,
    term_matches,
    tolerates,
    untolerated_taint,
)
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import LabelSelector, NodeSelectorTerm, NodeView, SelectorRequirement, Taint, Toleration
from tests.model.factories import node

KEY1 = Taint(key="key1", value="value1", effect="NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        (Toleration(key="key1", operator="Equal", value="value1", effect="NoSchedule"), True),
        (Toleration(key="key1", operator="Exists", effect="NoSchedule"), True),
        (Toleration(key="key1", value="value1", effect="NoSchedule"), True),  # no operator means Equal
        (Toleration(key="key1", operator="Equal", value="value2", effect="NoSchedule"), False),
        (Toleration(key="key1", operator="Equal", value="value1", effect="NoExecute"), False),
        (Toleration(key="key1", operator="Equal", value="value1"), True),  # empty effect matches all effects
        (Toleration(operator="Exists"), True),  # empty key with Exists tolerates everything
        (Toleration(operator="Equal", value="value1"), False),  # empty key is valid only with Exists
        (Toleration(key="key2", operator="Exists"), False),
    ],
)
def test_tolerations_match_taints_as_the_scheduler_does(toleration: Toleration, tolerated: bool) -> None:
    assert tolerates(toleration, KEY1) is tolerated


@pytest.mark.parametrize("operator", ["Gt", "Lt", "Whatever"])
def test_gt_and_lt_tolerations_tolerate_nothing(operator: str) -> None:
    taint = Taint(key="example.com/priority", value="5", effect="NoSchedule")
    assert not tolerates(Toleration(key="example.com/priority", operator=operator, value="3"), taint)
    assert not tolerates(Toleration(key="example.com/priority", operator=operator, value="9"), taint)


def test_a_pod_tolerating_two_of_three_taints_is_still_kept_off_the_node() -> None:
    # The docs' example: taints key1=value1:NoSchedule, key1=value1:NoExecute,
    # key2=value2:NoSchedule; tolerating both key1 taints leaves key2 untolerated.
    taints = (
        KEY1,
        Taint(key="key1", value="value1", effect="NoExecute"),
        Taint(key="key2", value="value2", effect="NoSchedule"),
    )
    tolerations = (
        Toleration(key="key1", operator="Equal", value="value1", effect="NoSchedule"),
        Toleration(key="key1", operator="Equal", value="value1", effect="NoExecute"),
    )
    assert untolerated_taint(taints, tolerations) == taints[2]


def test_prefer_no_schedule_taints_do_not_keep_a_set_off() -> None:
    assert untolerated_taint([Taint(key="k", effect="PreferNoSchedule")], []) is None


@pytest.mark.parametrize(
    "key", ["node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"]
)
def test_condition_taints_are_left_to_the_cordon_and_ready_checks(key: str) -> None:
    n = node("n1", taints=(Taint(key=key, effect="NoSchedule"),))
    assert node_problem(n, node_name="n1") is None


def test_a_taint_never_counts_as_a_cordon() -> None:
    n = node("n1", taints=(Taint(key="maintenance", effect="NoExecute"),))
    problem = node_problem(n, node_name="n1")
    assert problem is not None
    assert problem.reason is Reason.TAINT_NOT_TOLERATED
    assert "maintenance:NoExecute" in problem.message


def test_a_missing_node_an_unready_node_and_a_cordoned_node_take_no_binds() -> None:
    def reason(view: NodeView | None) -> Reason | None:
        problem = node_problem(view, node_name="n1")
        return problem.reason if problem else None

    assert reason(None) is Reason.NODE_GONE
    assert reason(node("n1", ready=False)) is Reason.NODE_NOT_READY
    assert reason(node("n1", unschedulable=True)) is Reason.NODE_CORDONED
    assert reason(node("n1")) is None


def test_a_cordon_is_reported_only_when_it_is_the_nodes_only_problem() -> None:
    problem = node_problem(node("n1", unschedulable=True, ready=False), node_name="n1")
    assert problem is not None
    assert problem.reason is Reason.NODE_NOT_READY


def test_the_class_tolerations_let_a_set_onto_a_tainted_node() -> None:
    n = node("n1", taints=(Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule"),))
    tolerations = (Toleration(key="nvidia.com/gpu", operator="Exists"),)
    assert node_problem(n, node_name="n1", tolerations=tolerations) is None


def test_label_selectors_match_labels_and_expressions() -> None:
    labels = {"gpu": "h100", "zone": "a"}
    assert selector_matches(None, labels)
    assert selector_matches(LabelSelector(), labels)
    assert selector_matches(LabelSelector(match_labels=(("gpu", "h100"),)), labels)
    assert not selector_matches(LabelSelector(match_labels=(("gpu", "a10"),)), labels)

    def expr(op: str, *values: str, key: str = "zone") -> LabelSelector:
        return LabelSelector(match_expressions=(SelectorRequirement(key=key, operator=op, values=values),))

    assert selector_matches(expr("In", "a", "b"), labels)
    assert not selector_matches(expr("NotIn", "a"), labels)
    assert selector_matches(expr("NotIn", "a", key="rack"), labels)
    assert selector_matches(expr("Exists"), labels)
    assert selector_matches(expr("DoesNotExist", key="rack"), labels)
    assert not selector_matches(expr("Gt", "1"), labels)


def test_a_class_node_selector_and_a_vmi_node_selector_both_exclude_nodes() -> None:
    n = node("n1", labels={"gpu": "h100"})
    problem = node_problem(n, node_name="n1", selector=LabelSelector(match_labels=(("gpu", "a10"),)))
    assert problem is not None
    assert problem.reason is Reason.NODE_SELECTOR_MISMATCH
    problem = node_problem(n, node_name="n1", node_selector={"zone": "b"})
    assert problem is not None
    assert "zone=b" in problem.message


# -- the VMI's required node affinity (kube-scheduler's NodeAffinity filter) ------------------


def req(key: str, operator: str, *values: str) -> SelectorRequirement:
    return SelectorRequirement(key=key, operator=operator, values=values)


LABELS = {"zone": "a", "gen": "5"}


@pytest.mark.parametrize(
    ("term", "matches"),
    [
        (NodeSelectorTerm(match_expressions=(req("zone", "In", "a", "b"),)), True),
        (NodeSelectorTerm(match_expressions=(req("zone", "NotIn", "a"),)), False),
        (NodeSelectorTerm(match_expressions=(req("rack", "NotIn", "r1"),)), True),  # an absent label passes NotIn
        (NodeSelectorTerm(match_expressions=(req("gen", "Exists"),)), True),
        (NodeSelectorTerm(match_expressions=(req("gen", "DoesNotExist"),)), False),
        (NodeSelectorTerm(match_expressions=(req("gen", "Gt", "4"),)), True),
        (NodeSelectorTerm(match_expressions=(req("gen", "Gt", "5"),)), False),
        (NodeSelectorTerm(match_expressions=(req("gen", "Lt", "6"),)), True),
        (NodeSelectorTerm(match_expressions=(req("zone", "Lt", "6"),)), False),  # a label that is no integer
        (NodeSelectorTerm(match_fields=(req("metadata.name", "In", "n1"),)), True),
        (NodeSelectorTerm(match_fields=(req("metadata.name", "NotIn", "n1"),)), False),
        (
            NodeSelectorTerm(
                match_expressions=(req("zone", "In", "a"),), match_fields=(req("metadata.name", "In", "n2"),)
            ),
            False,
        ),  # a term's requirements are ANDed
        (NodeSelectorTerm(), False),  # an empty term matches nothing
        # Malformed terms match nothing, as the scheduler drops them:
        (NodeSelectorTerm(match_expressions=(req("zone", "In"),)), False),
        (NodeSelectorTerm(match_expressions=(req("gen", "Gt", "four"),)), False),
        (NodeSelectorTerm(match_expressions=(req("gen", "Exists", "5"),)), False),
        (NodeSelectorTerm(match_expressions=(req("zone", "Matches", "a"),)), False),
        (NodeSelectorTerm(match_fields=(req("metadata.labels", "In", "n1"),)), False),
        (NodeSelectorTerm(match_fields=(req("metadata.name", "In", "n1", "n2"),)), False),
    ],
)
def test_a_node_selector_term_matches_as_the_scheduler_reads_it(term: NodeSelectorTerm, matches: bool) -> None:
    assert term_matches(term, "n1", LABELS) is matches


def test_terms_are_ored_and_no_affinity_passes_every_node() -> None:
    miss = NodeSelectorTerm(match_expressions=(req("zone", "In", "b"),))
    hit = NodeSelectorTerm(match_fields=(req("metadata.name", "In", "n1"),))
    assert affinity_matches((miss, hit), "n1", LABELS)
    assert not affinity_matches((miss,), "n1", LABELS)
    assert not affinity_matches((), "n1", LABELS)  # required, with no term: no node
    assert affinity_matches(None, "n1", LABELS)


def test_a_node_the_vmis_affinity_excludes_is_refused_with_that_reason() -> None:
    terms = (NodeSelectorTerm(match_expressions=(req("zone", "In", "b"),)),)
    problem = node_problem(node("n1", labels={"zone": "a"}), node_name="n1", node_affinity=terms)
    assert problem is not None
    assert problem.reason is Reason.NODE_SELECTOR_MISMATCH
    assert "required node affinity" in problem.message
    assert node_problem(node("n2", labels={"zone": "b"}), node_name="n2", node_affinity=terms) is None
