"""DRA units (SPEC §1.5): which ResourceSlice devices a DRA-sourced offer sells, node by node.

A unit of a GPUClass with ``source.dra`` is one device of a ResourceSlice that
its DeviceClass's selectors **and** the class's own selectors match, as
kube-scheduler's allocator matches a request of that DeviceClass with those
selectors (``k8s.io/dynamic-resource-allocation/structured``: a device is a
candidate when every selector of the class and of the request is true). This
module answers that from decoded slices; it is pure and reads no clock.

What the allocator does that is kept here:

- **Pools.** Devices are published in pools (``spec.pool``: a name, a
  ``generation``, a ``resourceSliceCount``). Only the slices of a pool's
  newest generation count, and a pool whose newest generation has fewer
  slices than it announces is *incomplete*: none of its devices are used
  (the allocator waits for the driver to finish publishing). Each is named in
  ``problems``.
- **Selectors.** Compiled by the project's CEL subset (``cozygpu.model.cel``).
  A selector that does not compile makes the offer serve nothing; one that
  fails on a device (a missing attribute, a type mismatch) leaves that device
  out, as the allocator's evaluation error does. Both are named in
  ``problems`` (once per selector and error, not per device).
- **Node-local slices only.** A slice with ``spec.nodeName`` serves that node;
  slices for a node selector or all nodes (network-attached devices) are not
  GPUs a VM on one node can take and are skipped.

Which devices are taken is the claims' to say (``ClaimView``: every
allocated claim's results, whoever allocated it), and a hold's devices are
chosen from the rest (``choose_devices``), keeping a ``matchAttribute``
constraint where the offer asks for one (every chosen device has the
attribute, with one value), best fit first so the large groups stay whole for
large sets.

- **Taints.** A device tainted ``NoSchedule`` or ``NoExecute`` is no unit,
  and is named in ``problems``: a hold on it has lost capacity and moves
  (R-BIND-5). The taint is its driver's (``spec.devices[].taints``) or an
  administrator's DeviceTaintRule (``resource.k8s.io/v1`` since 1.37, both GA
  there) whose selector names its driver, pool and device
  (``with_rule_taints``). Tolerations in the offer are not read: a tainted
  device is never sold.

Not here: ``adminAccess``; partitionable devices and their shared counters.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

import attrs

from cozygpu.model.cel import CelError, DeviceAttrs, Selector
from cozygpu.model.cel import compile as compile_selector
from cozygpu.model.snapshot import DeviceKey, DraGroup, DraSource, GPUClassView


@attrs.frozen(kw_only=True)
class SliceDevice:
    """One device of a slice: its name and what selectors see of it (None, with why, when unreadable)."""

    name: str
    attrs: DeviceAttrs | None
    problem: str = ""
    #: The driver's first taint that keeps new allocations off the device (``NoSchedule``, ``NoExecute``),
    #: as ``key=value:effect``; empty when none does.
    taint: str = ""


@attrs.frozen(kw_only=True)
class SliceView:
    """A ResourceSlice, as the units read it."""

    name: str
    driver: str
    pool: str
    generation: int
    #: ``spec.pool.resourceSliceCount``: how many slices the pool's generation has.
    slice_count: int
    #: ``spec.nodeName``; empty for slices of a node selector or of all nodes.
    node: str
    devices: tuple[SliceDevice, ...] = ()


@attrs.frozen(kw_only=True)
class TaintRule:
    """A DeviceTaintRule that keeps allocations off the devices it selects (effect ``NoSchedule`` or
    ``NoExecute``; a rule of effect ``None`` only informs and is not one). Its selector's fields are ANDed; an
    unset field matches every device (the empty selector: all devices)."""

    name: str
    #: ``key=value:effect``, as a device's own taint reads.
    taint: str
    driver: str | None = None
    pool: str | None = None
    device: str | None = None

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return ((self.driver is None or self.driver == driver) and (self.pool is None or self.pool == pool)
                and (self.device is None or self.device == device))


def with_rule_taints(slices: Sequence[SliceView], rules: Iterable[TaintRule]) -> Sequence[SliceView]:
    """``slices`` with each device some rule selects tainted by the first such rule (by name), unless its driver
    tainted it already; the same sequence when no rule selects anything."""
    ordered = sorted(rules, key=lambda r: r.name)
    if not ordered:
        return slices
    out: list[SliceView] = []
    for found in slices:
        devices = tuple(
            device if device.taint else attrs.evolve(device, taint=next(
                (f"{rule.taint} (DeviceTaintRule {rule.name})" for rule in ordered
                 if rule.selects(found.driver, found.pool, device.name)), ""))
            for device in found.devices)
        out.append(found if devices == found.devices else attrs.evolve(found, devices=devices))
    return out


@attrs.frozen(order=True)
class DeviceRef:
    """A device as an allocation names it."""

    driver: str
    pool: str
    device: str


#: A claim by namespace and name (a hold claim's is its GPUDevice's key).
ClaimKey = DeviceKey


@attrs.frozen(kw_only=True)
class DraUnits:
    """The devices an offer sells, by node (each tuple sorted), and what kept others out."""

    by_node: Mapping[str, tuple[DeviceRef, ...]]
    problems: tuple[str, ...] = ()
    #: The offer's ``matchAttribute``: a hold's devices share its value (empty: any devices will do).
    match_attribute: str = ""

    def count(self, node: str) -> int:
        return len(self.by_node.get(node, ()))


def current_slices(slices: Iterable[SliceView]) -> tuple[list[SliceView], list[str]]:
    """The node-local slices of each pool's newest generation, when that generation is complete; and
    the pools left out, with why."""
    newest: dict[tuple[str, str], list[SliceView]] = {}
    for found in slices:
        if not found.node:
            continue
        key = (found.driver, found.pool)
        kept = newest.get(key)
        if kept is None or found.generation > kept[0].generation:
            newest[key] = [found]
        elif found.generation == kept[0].generation:
            kept.append(found)
    out: list[SliceView] = []
    problems: list[str] = []
    for (driver, pool), members in sorted(newest.items()):
        announced = max(member.slice_count for member in members)
        if len(members) < announced:
            problems.append(f"pool {pool!r} of driver {driver!r} is incomplete: {len(members)} of {announced} "
                            f"slices of generation {members[0].generation} published")
            continue
        out.extend(members)
    return out, problems


def offer_units(slices: Iterable[SliceView], device_class: Sequence[str] | None, selectors: Sequence[str]) -> DraUnits:
    """The units of an offer: devices of the current slices that every selector of its DeviceClass
    (``device_class``; None when that DeviceClass does not exist) and of the offer itself matches."""
    if device_class is None:
        return DraUnits(by_node={}, problems=("its DeviceClass does not exist",))
    compiled: list[Selector] = []
    problems: list[str] = []
    for origin, expressions in (("the DeviceClass", device_class), ("the class", selectors)):
        for at, expression in enumerate(expressions):
            try:
                compiled.append(compile_selector(expression))
            except CelError as error:
                problems.append(f"selector {at} of {origin} is refused: {error}")
    if problems:
        return DraUnits(by_node={}, problems=tuple(problems))
    current, problems = current_slices(slices)
    failed: dict[str, int] = {}
    by_node: dict[str, list[DeviceRef]] = {}
    for found in current:
        for device in found.devices:
            if device.attrs is None:
                failed[f"device {device.name!r} of pool {found.pool!r} is unreadable: {device.problem}"] = 1
                continue
            if device.taint:
                # A tainted device (its driver's taint or a DeviceTaintRule's) is no unit; a hold on it has lost
                # capacity and moves (R-BIND-5), as off a node gone NotReady.
                failed[f"device {device.name!r} of pool {found.pool!r} is tainted {device.taint}"] = 1
                continue
            try:
                matched = all(selector.matches(device.attrs) for selector in compiled)
            except CelError as error:
                why = f"a selector failed on some devices: {error}"
                failed[why] = failed.get(why, 0) + 1
                continue
            if matched:
                by_node.setdefault(found.node, []).append(DeviceRef(found.driver, found.pool, device.name))
    problems.extend(f"{why} ({count} devices)" if count > 1 else why for why, count in failed.items())
    return DraUnits(by_node={node: tuple(sorted(refs)) for node, refs in by_node.items()}, problems=tuple(problems))


@attrs.frozen(kw_only=True)
class ClaimView:
    """A ResourceClaim, as the units read it: the devices its allocation holds (none while unallocated)."""

    namespace: str
    name: str
    allocated: tuple[DeviceRef, ...] = ()
    #: The node of the allocation's ``matchFields metadata.name`` selector; empty when it names none or several.
    node: str = ""
    #: The GPUDevice that owns it (its controller reference, of our group), or empty: a claim of someone else's.
    holder: str = ""

    @property
    def is_hold(self) -> bool:
        """A hold: the claim of the GPUDevice of its own name (a claim of another owner that carries a
        device's name is someone else's)."""
        return self.holder == self.name


def taken_devices(claims: Iterable[ClaimView]) -> dict[DeviceRef, ClaimView]:
    """Every device some claim's allocation holds, with that claim (the first, by key, where two do)."""
    taken: dict[DeviceRef, ClaimView] = {}
    for claim in sorted(claims, key=lambda c: (c.namespace, c.name)):
        for ref in claim.allocated:
            taken.setdefault(ref, claim)
    return taken


def choose_devices(units: Sequence[DeviceRef], taken: Collection[DeviceRef], count: int, *,
                   attrs_of: Mapping[DeviceRef, DeviceAttrs] | None = None,
                   match_attribute: str = "") -> tuple[DeviceRef, ...] | None:
    """``count`` of a node's ``units`` that no claim holds, or None when they are not there.

    With ``match_attribute`` (a qualified name, ``resource.kubernetes.io/pcieRoot``), every chosen device
    has that attribute and all share one value: the smallest group that fits is taken (the rest of the
    node's large groups stay whole for larger sets). ``count`` is compared with the free devices before
    any grouping, so a count larger than the node costs nothing.
    """
    free = [ref for ref in units if ref not in taken]
    if count <= 0 or count > len(free):
        return None
    if not match_attribute:
        return tuple(sorted(free)[:count])
    fitting = [sorted(group) for group in _groups(free, attrs_of, match_attribute) if len(group) >= count]
    if not fitting:
        return None
    return tuple(min(fitting, key=lambda group: (len(group), group))[:count])


def _groups(free: Iterable[DeviceRef], attrs_of: Mapping[DeviceRef, DeviceAttrs] | None,
            match_attribute: str) -> list[list[DeviceRef]]:
    """``free`` by their value of ``match_attribute`` (devices without it in none)."""
    groups: dict[str, list[DeviceRef]] = {}
    for ref in free:
        value = _group_value(ref, attrs_of, match_attribute)
        if value is not None:
            groups.setdefault(value, []).append(ref)
    return list(groups.values())


def _group_value(ref: DeviceRef, attrs_of: Mapping[DeviceRef, DeviceAttrs] | None, match_attribute: str) -> str | None:
    """The group ``ref`` is in: its value of ``match_attribute`` (typed, so 1 and "1" differ), None without it."""
    domain, _, name = match_attribute.rpartition("/")
    found = attrs_of.get(ref) if attrs_of is not None else None
    values = found.attributes.get(domain or ref.driver, {}) if found is not None else {}
    if name not in values:
        return None
    return f"{type(values[name]).__name__}:{values[name]}"


def node_groups(refs: Iterable[DeviceRef], first: Callable[[DeviceRef], ClaimView | None], match_attribute: str,
                attrs_of: Mapping[DeviceRef, DeviceAttrs]) -> tuple[DraGroup, ...]:
    """One node's groups of an offer with ``match_attribute`` (by value), ``first(ref)`` the claim deciding a
    device as in ``node_served``. A hold whose claim spans two groups is in neither (moving it frees no group
    whole); someone else's claim's devices are neither free nor movable."""
    free: dict[str, int] = {}
    holding: dict[str, set[ClaimKey]] = {}
    group_of: dict[ClaimKey, str | None] = {}
    for ref in refs:
        value = _group_value(ref, attrs_of, match_attribute)
        if value is None:
            continue
        claim = first(ref)
        free.setdefault(value, 0)
        if claim is None:
            free[value] += 1
        elif claim.holder:
            key = (claim.namespace, claim.name)
            group_of[key] = value if group_of.get(key, value) == value else None
            holding.setdefault(value, set()).add(key)
    return tuple(DraGroup(value=value, free=n,
                          holds=frozenset(key for key in holding.get(value, ()) if group_of[key] == value))
                 for value, n in sorted(free.items()))


def node_served(refs: Iterable[DeviceRef], first: Callable[[DeviceRef], ClaimView | None], match_attribute: str,
                attrs_of: Mapping[DeviceRef, DeviceAttrs]) -> int:
    """What an offer serves on one node from its units ``refs``, ``first(ref)`` the claim deciding a device
    (None: free): without ``match_attribute``, every unit no claim of someone else's holds; with one, the
    holds' units plus the largest free group sharing a value, so the room a placement sees is the largest
    set a hold there can take whole (a larger one is refused before it is placed)."""
    if not match_attribute:
        return sum(1 for ref in refs if (claim := first(ref)) is None or claim.holder)
    held, free = 0, []
    for ref in refs:
        claim = first(ref)
        if claim is None:
            free.append(ref)
        elif claim.holder:
            held += 1
    return held + max((len(group) for group in _groups(free, attrs_of, match_attribute)), default=0)


@attrs.frozen(kw_only=True)
class DraServed:
    """What DRA-sourced classes serve: node -> resource name -> units (the read model's ``dra`` input), the
    units someone else's claims hold by namespace (its ``dra_raw``: raw use), and why a class serves less
    than its slices hold (by class name)."""

    by_node: Mapping[str, Mapping[str, int]]
    problems: Mapping[str, tuple[str, ...]]
    raw_by_namespace: Mapping[str, Mapping[str, int]] = attrs.field(factory=dict)


def dra_offers(classes: Iterable[GPUClassView], slices: Sequence[SliceView],
               device_classes: Mapping[str, Sequence[str]]) -> tuple[dict[str, DraUnits], dict[str, tuple[str, ...]]]:
    """Each DRA-sourced resource name's units, and why a class serves less than its slices hold.

    Classes that sell one resource name must read one offer; where two differ, the first by name is the
    offer and the others say so. ``device_classes``: each DeviceClass's selectors, by name.
    """
    by_name: dict[str, list[tuple[str, DraSource]]] = {}
    for gpu_class in sorted(classes, key=lambda c: c.name):
        if gpu_class.dra is not None:
            by_name.setdefault(gpu_class.resource_name, []).append((gpu_class.name, gpu_class.dra))
    offers: dict[str, DraUnits] = {}
    problems: dict[str, tuple[str, ...]] = {}
    for resource_name, sellers in sorted(by_name.items()):
        first, offer = sellers[0]
        units = offers[resource_name] = attrs.evolve(
            offer_units(slices, device_classes.get(offer.device_class), offer.selectors),
            match_attribute=offer.match_attribute)
        for name, source in sellers:
            said = list(units.problems)
            if source != offer:
                said.append(f"class {first!r} sells {resource_name} from another DRA offer; its units are used")
            if said:
                problems[name] = tuple(said)
    return offers, problems


def device_attrs(slices: Sequence[SliceView]) -> dict[DeviceRef, DeviceAttrs]:
    """Every readable device of the current slices (``current_slices``), with what selectors see of it."""
    return {DeviceRef(found.driver, found.pool, device.name): device.attrs
            for found in current_slices(slices)[0] for device in found.devices if device.attrs is not None}


def dra_served(classes: Iterable[GPUClassView], slices: Sequence[SliceView],
               device_classes: Mapping[str, Sequence[str]], claims: Iterable[ClaimView]) -> DraServed:
    """Units each DRA-sourced resource name serves per node: the devices its offer matches that no claim
    of someone else's holds (a hold's devices stay served: its GPUDevice counts as held there). From
    scratch: the reference ``DraTracker`` is kept equal to."""
    offers, problems = dra_offers(classes, slices, device_classes)
    claims = list(claims)
    taken = taken_devices(claims)
    attrs_of = device_attrs(slices)
    by_node: dict[str, dict[str, int]] = {}
    for resource_name, units in offers.items():
        for node, refs in units.by_node.items():
            free = node_served(refs, taken.get, units.match_attribute, attrs_of)
            if free:
                by_node.setdefault(node, {})[resource_name] = free
    sold = {resource_name: {ref for refs in units.by_node.values() for ref in refs}
            for resource_name, units in offers.items()}
    raw: dict[str, dict[str, int]] = {}
    for claim in claims:
        if claim.holder:
            continue
        for resource_name, devices in sold.items():
            held = sum(1 for ref in claim.allocated if ref in devices)
            if held:
                counted = raw.setdefault(claim.namespace, {})
                counted[resource_name] = counted.get(resource_name, 0) + held
    return DraServed(by_node={node: by_node[node] for node in sorted(by_node)}, problems=problems,
                     raw_by_namespace=raw)
