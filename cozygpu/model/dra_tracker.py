"""What DRA offers serve, kept current from claim changes: the live read model's DRA input (SPEC §1.5).

Contract: pure; the offers are fixed for a tracker's life, and a claim change re-counts only the nodes whose
devices it held or holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from cozygpu.model.dra import (
    ClaimKey,
    ClaimView,
    DeviceRef,
    SliceView,
    device_attrs,
    dra_offers,
    node_groups,
    node_served,
)
from cozygpu.model.snapshot import DraGroup, GPUClassView


class DraTracker:
    """``dra_served``, kept current from claim changes (the live read model's DRA input).

    Offers (slices, DeviceClasses, GPU classes) are fixed for the tracker's life: a change of one makes a
    new tracker (the read model rebuilds). Claims come and go by the thousand (every pod with a claim of
    its own), so :meth:`claims_changed` re-counts only the nodes whose devices the changed claims held or
    hold: what a claim change costs is its devices, not the fleet. A device is someone else's when the
    first claim holding it (by key, as ``taken_devices`` picks) has no GPUDevice holder.

    The binder's claims work reads the same tracker: the offers' ``units``, every device's attributes
    (``attrs_of``) and the claims by key (``claims``). Not safe to share between threads.
    """

    def __init__(self, classes: Iterable[GPUClassView], slices: Sequence[SliceView],
                 device_classes: Mapping[str, Sequence[str]], claims: Iterable[ClaimView]) -> None:
        self.units, self.problems = dra_offers(classes, slices, device_classes)
        #: Every device of the current slices, with what selectors see of it (readable ones only).
        self.attrs_of = device_attrs(slices)
        self._node_of = {ref: node for units in self.units.values() for node, refs in units.by_node.items()
                         for ref in refs}
        #: Each sold device's resource names (two offers may sell one device).
        self._names_of: dict[DeviceRef, list[str]] = {}
        for resource_name, units in self.units.items():
            for refs in units.by_node.values():
                for ref in refs:
                    self._names_of.setdefault(ref, []).append(resource_name)
        #: Namespace -> resource name -> units its own claims (not holds) hold: raw use.
        self.raw_by_namespace: dict[str, dict[str, int]] = {}
        self.claims: dict[ClaimKey, ClaimView] = {}
        self._holding: dict[DeviceRef, set[ClaimKey]] = {}
        for claim in claims:
            self._put((claim.namespace, claim.name), claim)

    def _raw(self, claim: ClaimView, sign: int) -> None:
        if claim.holder:
            return
        counted = self.raw_by_namespace.setdefault(claim.namespace, {})
        for ref in claim.allocated:
            for resource_name in self._names_of.get(ref, ()):
                n = counted.get(resource_name, 0) + sign
                if n:
                    counted[resource_name] = n
                else:
                    del counted[resource_name]
        if not counted:
            del self.raw_by_namespace[claim.namespace]

    def _put(self, key: ClaimKey, claim: ClaimView | None) -> set[str]:
        """Set one claim (None: gone); the nodes whose served count may have moved."""
        touched: set[str] = set()
        before = self.claims.pop(key, None)
        if before is not None:
            self._raw(before, -1)
        for ref in before.allocated if before is not None else ():
            holding = self._holding.get(ref)
            if holding is not None:
                holding.discard(key)
                if not holding:
                    del self._holding[ref]
            if ref in self._node_of:
                touched.add(self._node_of[ref])
        if claim is not None:
            self.claims[key] = claim
            self._raw(claim, +1)
            for ref in claim.allocated:
                self._holding.setdefault(ref, set()).add(key)
                if ref in self._node_of:
                    touched.add(self._node_of[ref])
        return touched

    def foreign(self, ref: DeviceRef) -> bool:
        """Whether someone else's claim holds ``ref`` (not a GPUDevice's hold)."""
        claim = self.first(ref)
        return claim is not None and not claim.holder

    def first(self, ref: DeviceRef) -> ClaimView | None:
        """The claim that decides ``ref`` (the first by key of those holding it), None while it is free."""
        holding = self._holding.get(ref)
        return self.claims[min(holding)] if holding is not None else None

    def served_on(self, node: str) -> dict[str, int]:
        """Resource name -> what the node serves (``node_served``; names serving none left out)."""
        served: dict[str, int] = {}
        for resource_name, units in self.units.items():
            free = node_served(units.by_node.get(node, ()), self.first, units.match_attribute, self.attrs_of)
            if free:
                served[resource_name] = free
        return served

    def served(self) -> dict[str, dict[str, int]]:
        """Node -> ``served_on`` of every node some offer has units on (nodes serving nothing left out)."""
        return {node: served for node in self._nodes() if (served := self.served_on(node))}

    def groups_on(self, node: str) -> dict[str, tuple[DraGroup, ...]]:
        """Resource name -> the node's groups (``node_groups``), for the offers with a ``matchAttribute``."""
        return {resource_name: groups for resource_name, units in self.units.items() if units.match_attribute
                and (groups := node_groups(units.by_node.get(node, ()), self.first, units.match_attribute,
                                           self.attrs_of))}

    def groups(self) -> dict[str, dict[str, tuple[DraGroup, ...]]]:
        """Node -> ``groups_on`` of every node an offer with a ``matchAttribute`` has units on."""
        if not any(units.match_attribute for units in self.units.values()):
            return {}
        return {node: groups for node in self._nodes() if (groups := self.groups_on(node))}

    def _nodes(self) -> list[str]:
        return sorted({node for units in self.units.values() for node in units.by_node})

    def claims_changed(self, changes: Mapping[ClaimKey, ClaimView | None]) -> ClaimChanges:
        """Take claim changes (None: gone): what each node they touch serves now and its groups (empty:
        nothing), and each namespace they are in, with its raw use now (empty: none)."""
        touched: set[str] = set()
        for key, claim in changes.items():
            touched |= self._put(key, claim)
        namespaces = sorted({key[0] for key in changes})
        grouped = any(units.match_attribute for units in self.units.values())
        return ClaimChanges(
            served={node: self.served_on(node) for node in sorted(touched)},
            raw={namespace: dict(self.raw_by_namespace.get(namespace, {})) for namespace in namespaces},
            groups={node: self.groups_on(node) for node in sorted(touched)} if grouped else {})


@attrs.frozen(kw_only=True)
class ClaimChanges:
    """What claim changes moved (``DraTracker.claims_changed``), as the read model's update takes it."""

    #: Node -> resource name -> units served (empty: none left).
    served: Mapping[str, Mapping[str, int]]
    #: Namespace -> resource name -> raw use (empty: none left).
    raw: Mapping[str, Mapping[str, int]]
    #: Node -> resource name -> groups, for offers with a ``matchAttribute`` (empty: none left).
    groups: Mapping[str, Mapping[str, tuple[DraGroup, ...]]]
