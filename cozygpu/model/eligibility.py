"""Node eligibility: may a node take (or keep) a class's units? (R-MOD-8)

Why: the binder must never place a set where its launcher pod could not be
scheduled, and admission must not promise units on such a node. The
scheduler decides with spec.unschedulable and NoSchedule/NoExecute taints;
we also require Ready, since the not-ready and unreachable taints appear
only after the node lifecycle controller notices.

Contract:
- A node takes binds only when it exists, is Ready, carries no NoSchedule or
  NoExecute taint the launcher pod would not tolerate, matches the class's
  nodeSelector, and is schedulable.
- The unschedulable, not-ready and unreachable taints are left to the
  unschedulable and Ready checks: a taint never counts as a cordon.
- Toleration matching follows Kubernetes: a non-empty effect must equal the
  taint's, an empty effect matches every effect; a non-empty key must equal
  the taint's, an empty key is valid only with Exists and matches every key;
  Equal (or no operator) compares values, Exists matches any value. Gt and
  Lt tolerate nothing (the scheduler ignores them while their gate is off),
  nor does any other operator.
- The VMI's required node affinity (``nodeSelectorTerms``) is evaluated as
  kube-scheduler's NodeAffinity filter does: terms are ORed, a term's
  requirements ANDed, a term with none matches nothing. Label requirements
  take In, NotIn (an absent label passes), Exists, DoesNotExist, Gt and Lt
  (one integer value, compared with the label's integer value); field
  requirements take only ``metadata.name`` with In or NotIn and one value.
  A malformed term matches nothing, as the scheduler drops a term it cannot
  parse.
- :func:`node_problem` reports a cordon only when it is the node's sole
  problem, so the binder can apply R-BIND-6 (a cordon alone may keep a set).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cozygpu.model import refusals
from cozygpu.model.refusals import Reason, Refusal
from cozygpu.model.snapshot import LabelSelector, NodeSelectorTerm, NodeView, SelectorRequirement, Taint, Toleration

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
#: Taints the node lifecycle controller derives from the checks we make directly.
LEFT_TO_OTHER_CHECKS = frozenset(
    {"node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes ``ToleratesTaint`` with the comparison-operator gate off."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    operator = toleration.operator or "Equal"
    if not toleration.key:
        return operator == "Exists"
    if toleration.key != taint.key:
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return toleration.value == taint.value
    return False


def untolerated_taint(taints: Iterable[Taint], tolerations: Iterable[Toleration]) -> Taint | None:
    """The first NoSchedule/NoExecute taint no toleration tolerates, ignoring the condition taints."""
    held = tuple(tolerations)
    for taint in taints:
        if taint.effect not in BLOCKING_EFFECTS or taint.key in LEFT_TO_OTHER_CHECKS:
            continue
        if not any(tolerates(t, taint) for t in held):
            return taint
    return None


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """A label selector (None or empty matches everything); unknown operators match nothing."""
    if selector is None:
        return True
    for key, value in selector.match_labels:
        if labels.get(key) != value:
            return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        value = labels.get(requirement.key, "")
        op = requirement.operator
        if op == "In":
            ok = present and value in requirement.values
        elif op == "NotIn":
            ok = not present or value not in requirement.values
        elif op == "Exists":
            ok = present
        elif op == "DoesNotExist":
            ok = not present
        else:
            ok = False
        if not ok:
            return False
    return True


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _label_requirement(requirement: SelectorRequirement, labels: Mapping[str, str]) -> bool | None:
    """Whether the node's labels meet one requirement; None when the requirement is malformed."""
    op, values = requirement.operator, requirement.values
    present = requirement.key in labels
    value = labels.get(requirement.key, "")
    if op in ("In", "NotIn"):
        if not values:
            return None
        inside = present and value in values
        return inside if op == "In" else not inside
    if op in ("Exists", "DoesNotExist"):
        if values:
            return None
        return present if op == "Exists" else not present
    if op in ("Gt", "Lt"):
        bound = _integer(values[0]) if len(values) == 1 else None
        if bound is None:
            return None
        mine = _integer(value) if present else None
        if mine is None:
            return False
        return mine > bound if op == "Gt" else mine < bound
    return None


def _field_requirement(requirement: SelectorRequirement, node_name: str) -> bool | None:
    if requirement.key != "metadata.name" or requirement.operator not in ("In", "NotIn"):
        return None
    if len(requirement.values) != 1:
        return None
    same = node_name == requirement.values[0]
    return same if requirement.operator == "In" else not same


def term_matches(term: NodeSelectorTerm, node_name: str, labels: Mapping[str, str]) -> bool:
    """One node selector term: every requirement met (a malformed or empty term matches nothing)."""
    if not term.match_expressions and not term.match_fields:
        return False
    for requirement in term.match_expressions:
        if _label_requirement(requirement, labels) is not True:
            return False
    return all(_field_requirement(r, node_name) is True for r in term.match_fields)


def affinity_matches(terms: Iterable[NodeSelectorTerm] | None, node_name: str, labels: Mapping[str, str]) -> bool:
    """A required node affinity: None passes every node, otherwise any term matching."""
    if terms is None:
        return True
    return any(term_matches(term, node_name, labels) for term in terms)


def node_problem(
    node: NodeView | None,
    *,
    node_name: str,
    tolerations: Iterable[Toleration] = (),
    selector: LabelSelector | None = None,
    node_selector: Mapping[str, str] | None = None,
    node_affinity: Iterable[NodeSelectorTerm] | None = None,
) -> Refusal | None:
    """Why this node may not take units of a class (None when it may).

    ``tolerations`` are the launcher pod's (the class's and the VMI's),
    ``selector`` the class's nodeSelector, ``node_selector`` and
    ``node_affinity`` the VMI's (they become the launcher pod's).
    A cordon is reported only when nothing else is wrong.
    """
    if node is None:
        return refusals.node_refusal(Reason.NODE_GONE, node_name, "the Node does not exist")
    if not node.ready:
        return refusals.node_refusal(Reason.NODE_NOT_READY, node.name, "not Ready")
    taint = untolerated_taint(node.taints, tolerations)
    if taint is not None:
        shown = f"{taint.key}={taint.value}" if taint.value else taint.key
        return refusals.node_refusal(
            Reason.TAINT_NOT_TOLERATED, node.name, f"taint {shown}:{taint.effect} is not tolerated"
        )
    if not selector_matches(selector, node.labels):
        return refusals.node_refusal(Reason.NODE_SELECTOR_MISMATCH, node.name, "the class's nodeSelector excludes it")
    if node_selector:
        for key, value in node_selector.items():
            if node.labels.get(key) != value:
                return refusals.node_refusal(
                    Reason.NODE_SELECTOR_MISMATCH, node.name, f"the VMI's nodeSelector {key}={value} excludes it"
                )
    if not affinity_matches(node_affinity, node.name, node.labels):
        return refusals.node_refusal(
            Reason.NODE_SELECTOR_MISMATCH, node.name, "the VMI's required node affinity excludes it"
        )
    if node.unschedulable:
        return refusals.node_refusal(Reason.NODE_CORDONED, node.name, "cordoned (spec.unschedulable)")
    return None
