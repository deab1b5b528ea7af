"""The hold claims' plan (SPEC §1.5): what makes each Bound device of a DRA class hold its devices.

Contract: pure; one step per hold, its devices chosen from those no claim holds (``choose_devices``).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping

import attrs

from cozygpu.model.cel import DeviceAttrs
from cozygpu.model.dra import ClaimView, DeviceRef, DraUnits, choose_devices, taken_devices
from cozygpu.model.refusals import Refusal, devices_short
from cozygpu.model.snapshot import DeviceKey, DeviceView, GPUClassView


class ClaimAction(enum.StrEnum):
    #: No claim yet: create it (unallocated), then allocate it.
    CREATE = "Create"
    #: The claim holds no devices: allocate the chosen ones on the device's node.
    ALLOCATE = "Allocate"
    #: The claim holds devices elsewhere or too few or too many (the set moved): deallocate, then allocate.
    REALLOCATE = "Reallocate"
    #: Not enough free devices on the node for the hold (someone else's claim took one since it was placed).
    SHORT = "Short"


@attrs.frozen(kw_only=True)
class ClaimStep:
    """What the claims work does for one Bound device of a DRA class."""

    device: DeviceKey
    action: ClaimAction
    node: str
    #: The devices to allocate (empty for ``SHORT``).
    devices: tuple[DeviceRef, ...] = ()
    #: Why a ``SHORT`` step has none.
    refusal: Refusal | None = None


def claim_plan(holds: Iterable[DeviceView], classes: Mapping[str, GPUClassView],
               claims: Mapping[DeviceKey, ClaimView], units: Mapping[str, DraUnits],
               attrs_of: Mapping[DeviceRef, DeviceAttrs], *, in_use: Collection[DeviceKey] = ()) -> list[ClaimStep]:
    """The claim writes that make every Bound device of a DRA class hold its devices (SPEC §1.5).

    ``claims``: each device's own claim (named after it), by device key; ``units``: each DRA resource
    name's units (``offer_units``); ``in_use``: devices a running launcher uses, whose claim is never
    moved (R-BIND-7: the set moves when the VM stops). Devices already in any claim's allocation are
    taken, and each step's choice is taken for the next, so two holds on one node never share a device.
    A claim already holding ``count`` devices on its device's node is left alone.
    """
    taken = dict(taken_devices(claims.values()))
    steps: list[ClaimStep] = []
    for device in sorted(holds, key=lambda d: d.key):
        gpu_class = classes.get(device.class_name)
        if gpu_class is None or gpu_class.dra is None or not device.holds_units or device.node_name is None:
            continue
        node, claim = device.node_name, claims.get(device.key)
        if claim is not None and claim.allocated:
            if claim.node == node and len(claim.allocated) == device.count:
                continue
            if device.key in in_use:
                continue  # R-BIND-7: a running VM keeps what it runs on; the move waits for its stop
            for ref in claim.allocated:
                if taken.get(ref) is claim:
                    del taken[ref]
            action = ClaimAction.REALLOCATE
        else:
            action = ClaimAction.CREATE if claim is None else ClaimAction.ALLOCATE
        offer = units.get(gpu_class.resource_name)
        on_node = offer.by_node.get(node, ()) if offer is not None else ()
        chosen = choose_devices(on_node, taken, device.count, attrs_of=attrs_of,
                                match_attribute=gpu_class.dra.match_attribute)
        if chosen is None:
            free = sum(1 for ref in on_node if ref not in taken)
            steps.append(ClaimStep(device=device.key, action=ClaimAction.SHORT, node=node, refusal=devices_short(
                node, device=f"{device.namespace}/{device.name}", requested=device.count, free=free,
                match_attribute=gpu_class.dra.match_attribute)))
            continue
        held = ClaimView(namespace=device.namespace, name=device.name, allocated=chosen, node=node,
                         holder=device.name)
        for ref in chosen:
            taken[ref] = held
        steps.append(ClaimStep(device=device.key, action=action, node=node, devices=chosen))
    return steps
