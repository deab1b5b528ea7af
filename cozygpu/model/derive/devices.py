"""The device index: every device by key, by node and by VMI, the sets the answer passes act on, and the
units held by class.

Contract: ``add`` adds (+1) or takes away (-1) one device's index contributions; the maps a Snapshot shares
are ``CowMap``s, so a Snapshot handed out never changes under its reader.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from cozygpu.model.derive.shared import add_key, cow, drop_key
from cozygpu.model.snapshot import DeviceKey, DeviceView, Phase, VmiKey


class DeviceIndex:
    """The devices of a model and the indexes over them (no usage, no capacity: those are other parts')."""

    def __init__(self) -> None:
        self.devices: MutableMapping[DeviceKey, DeviceView] = {}
        #: Devices released after sitting idle (R-LEDGER-2): they hold nothing and are never placed.
        self.released: MutableMapping[DeviceKey, DeviceView] = {}
        self.unsettled: set[DeviceKey] = set()
        self._unsettled_by_name: dict[str, set[DeviceKey]] = {}
        #: Resource name -> its unsettled devices as the last snapshot has them (made again when they change).
        self._unsettled_frozen: dict[str, frozenset[DeviceKey]] = {}
        self.waiting: set[DeviceKey] = set()
        self.asking: set[DeviceKey] = set()
        self.by_node: MutableMapping[str, tuple[DeviceKey, ...]] = {}
        self.by_vmi: MutableMapping[VmiKey, tuple[DeviceKey, ...]] = {}
        self.class_held: MutableMapping[str, int] = {}
        #: Class -> its devices (a class's change takes their contributions away and adds them again).
        self.of_class: dict[str, set[DeviceKey]] = {}
        #: Class -> (units, how many stopped holds hold that many), by units: compaction's bound (R-BIND-11).
        self.stopped_sizes: MutableMapping[str, tuple[tuple[int, int], ...]] = {}

    def share(self) -> None:
        """The maps a Snapshot holds, as ``CowMap``s from now on."""
        self.devices, self.released = cow(self.devices), cow(self.released)
        self.by_node, self.by_vmi = cow(self.by_node), cow(self.by_vmi)
        self.class_held, self.stopped_sizes = cow(self.class_held), cow(self.stopped_sizes)

    def release(self, key: DeviceKey, device: DeviceView | None) -> DeviceView | None:
        """Note whether the device is released (R-LEDGER-2); what the rest of the model takes of it: None
        when it is released or gone, as a released device is out of the model but that map."""
        if device is not None and device.phase is Phase.RELEASED:
            self.released[key] = device
            return None
        if key in self.released:
            del self.released[key]
        return device

    def add(self, device: DeviceView, resource: str | None, sign: int) -> None:
        """Add (+1) or take away (-1) one device's index entries; ``resource``: its class's name, if known."""
        key = (device.namespace, device.name)
        name = resource or ""
        if sign > 0:
            self.devices[key] = device
            self.of_class.setdefault(device.class_name, set()).add(key)
            if device.phase is not Phase.BOUND:
                self.unsettled.add(key)
                self._unsettled_by_name.setdefault(name, set()).add(key)
                self._unsettled_frozen.pop(name, None)
            self.track_waiting(key, device)
        else:
            self.devices.pop(key, None)
            of_class = self.of_class.get(device.class_name)
            if of_class is not None:
                of_class.discard(key)
                if not of_class:
                    del self.of_class[device.class_name]
            if key in self.unsettled:
                self.unsettled.discard(key)
                of_name = self._unsettled_by_name[name]
                of_name.discard(key)
                if not of_name:
                    del self._unsettled_by_name[name]
                self._unsettled_frozen.pop(name, None)
            self.waiting.discard(key)
            self.asking.discard(key)
        change = add_key if sign > 0 else drop_key
        if device.attachment is not None:
            change(self.by_vmi, (device.namespace, device.attachment.vmi), key)
        if device.node_name:
            change(self.by_node, device.node_name, key)
        if device.node_name and device.phase is Phase.BOUND and resource is not None:
            by_class = self.class_held.get(device.class_name, 0) + sign * device.count
            if by_class:
                self.class_held[device.class_name] = by_class
            else:
                self.class_held.pop(device.class_name, None)
            if device.attachment is None and not device.template and not device.deleting:
                self._stopped(device.class_name, device.count, sign)

    def replace(self, key: DeviceKey, device: DeviceView) -> None:
        """A view of a device that contributes as the one held does (``alike``): only the view moves."""
        self.devices[key] = device
        self.track_waiting(key, device)

    def _stopped(self, class_name: str, count: int, sign: int) -> None:
        """One stopped hold of ``count`` units added (+1) or taken away (-1): a new tuple each time, as a
        snapshot may hold the old one."""
        sizes = dict(self.stopped_sizes.get(class_name, ()))
        sizes[count] = sizes.get(count, 0) + sign
        if not sizes[count]:
            del sizes[count]
        if sizes:
            self.stopped_sizes[class_name] = tuple(sorted(sizes.items()))
        else:
            self.stopped_sizes.pop(class_name, None)

    def track_waiting(self, key: DeviceKey, device: DeviceView) -> None:
        """The device is one an answer pass acts on (Pending, or asking) or not."""
        if device.phase is Phase.PENDING or device.unanswered_request:
            self.waiting.add(key)
        else:
            self.waiting.discard(key)
        if device.unanswered_request:
            self.asking.add(key)
        else:
            self.asking.discard(key)

    def unsettled_names(self) -> dict[str, frozenset[DeviceKey]]:
        """Resource name -> its unsettled devices, each set made again only when it changed."""
        frozen = self._unsettled_frozen
        for name, keys in self._unsettled_by_name.items():
            if name not in frozen:
                frozen[name] = frozenset(keys)
        for name in [name for name in frozen if name not in self._unsettled_by_name]:
            del frozen[name]
        return dict(frozen)


def alike(old: DeviceView, new: DeviceView) -> bool:
    """Two views of one device that contribute the same (units, usage, index buckets, the VMI attached)."""
    return (old.class_name == new.class_name and old.node_name == new.node_name and old.count == new.count
            and old.phase is new.phase and old.deleting == new.deleting and old.template == new.template
            and (old.attachment.vmi if old.attachment is not None else None)
            == (new.attachment.vmi if new.attachment is not None else None))
