"""The scheduling fields a pod spec and a VMI spec share: tolerations, node selector, required node affinity.

Each reader takes the ``spec`` (``meta.spec(obj)``) and returns the field
itself, not a copy and without walking it: a list's length is free, so a
reader compares it with its bound before it reads an entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from cozygpu.api.values import array, array_or_none, mapping, mapping_or_none

#: Where the required node-affinity terms are, for a message or a JSON patch.
TERMS_PATH: Final = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


def tolerations(spec: Mapping[str, Any]) -> Sequence[Any]:
    """``spec.tolerations`` (empty when missing or not a list)."""
    return array(spec.get("tolerations"))


def tolerations_or_none(spec: Mapping[str, Any]) -> Sequence[Any] | None:
    """``spec.tolerations``, None when missing or not a list (a patch must create it)."""
    return array_or_none(spec.get("tolerations"))


def node_selector(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """``spec.nodeSelector`` (empty when missing or not an object)."""
    return mapping(spec.get("nodeSelector"))


def affinity(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``spec.affinity``, None when missing or not an object."""
    return mapping_or_none(spec.get("affinity"))


def node_affinity(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``spec.affinity.nodeAffinity``, None when it (or ``affinity``) is missing or not an object."""
    return mapping_or_none(mapping(spec.get("affinity")).get("nodeAffinity"))


def required_terms(spec: Mapping[str, Any]) -> Sequence[Any]:
    """``nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`` (empty when not a list)."""
    required = mapping(mapping(node_affinity(spec)).get("requiredDuringSchedulingIgnoredDuringExecution"))
    return array(required.get("nodeSelectorTerms"))


def match_expressions(term: object) -> Sequence[Any]:
    """A node selector term's ``matchExpressions`` (empty when the term or the list is not one)."""
    return array(mapping(term).get("matchExpressions"))


def match_fields(term: object) -> Sequence[Any]:
    """A node selector term's ``matchFields`` (empty when the term or the list is not one)."""
    return array(mapping(term).get("matchFields"))


def requirement_values(requirement: object) -> Sequence[Any]:
    """A selector requirement's ``values`` (empty when the requirement or the list is not one)."""
    return array(mapping(requirement).get("values"))


def with_match_field(term: object, requirement: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``term`` with ``requirement`` added to its ``matchFields`` (ANDed with what it has)."""
    return {**mapping(term), "matchFields": [*match_fields(term), requirement]}
