"""The hold ledger (R-LEDGER-1, R-LEDGER-2): what each hold has held and left idle, and when it expires.

Why: a tenant keeps GPUs while its VMs are off; a hoster bills that, and may
take back what sits idle too long. Every figure here is derived from the
timestamps the binder writes into a hold's status (``Ledger``: ``heldSince``,
``idleSince``, ``idleSeconds``) and from the wall clock, never from a
process's memory: any replica, before or after a leader change, computes the
same numbers from the same objects.

- A hold is a Bound device (it holds units on a node). It is *running* while a
  VM uses it: it is attached to a VMI that exists (this UID) and has a
  launcher pod that has not finished (R-BIND-7's test). Otherwise it is idle.
- ``target`` is the ledger a hold's status must say now (what the binder
  writes): ``heldSince`` set once, ``idleSince`` set while idle and cleared
  when a VM runs on it, the ended idle period's seconds added to
  ``idleSeconds``.
- ``expiry`` is the class's rule: idle past ``limit - warning`` a warning,
  past ``limit`` a release; never while a VM runs on it or a VMI is attached
  (a start in progress), and a start resets the clock (``idleSince`` goes).
- ``figures`` and ``by_tenant`` are the metrics' and ``cozygpu usage``'s
  numbers: unit-seconds held and idle per hold (monotonic: ``heldSince`` never
  moves, idle time only accumulates), units held / running / idle per tenant
  namespace and class.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from datetime import datetime, timedelta

import attrs

from cozygpu.model.coverage import attached_to
from cozygpu.model.snapshot import DeviceKey, DeviceView, GPUClassView, Ledger, Snapshot


def runs(snapshot: Snapshot, device: DeviceView) -> bool:
    """Whether a running VM uses ``device``: it holds units, is attached to a VMI that exists (this UID), and
    that VMI has a launcher pod not finished (R-BIND-7's test), at the cost of that VMI's pods."""
    key = device.vmi_key
    vmi = snapshot.vmis.get(key) if key is not None else None
    return (vmi is not None and device.holds_units and attached_to(device, vmi)
            and any((pod := snapshot.pods.get(uid)) is not None and not pod.final for uid in vmi.active_pods))


def running_holds(snapshot: Snapshot) -> frozenset[DeviceKey]:
    """Every hold a running VM uses (``runs`` of each device)."""
    return frozenset(key for key, device in snapshot.devices.items() if runs(snapshot, device))


def target(device: DeviceView, running: bool, now: datetime) -> Ledger:
    """The ledger ``device``'s status must carry now; its current one when nothing moved. Only for a hold."""
    current = device.ledger
    if current.held_since is not None and (current.idle_since is None) == running:
        return current  # nothing moved (the common case)
    held_since = current.held_since or now
    if running:
        if current.idle_since is None:
            return attrs.evolve(current, held_since=held_since)
        ended = max((now - current.idle_since).total_seconds(), 0.0)
        return Ledger(held_since=held_since, idle_since=None, idle_seconds=current.idle_seconds + ended)
    return attrs.evolve(current, held_since=held_since, idle_since=current.idle_since or now)


class Expiry(enum.StrEnum):
    #: Idle past ``limit - warning``: a condition and an Event say when it will be released.
    WARN = "Warn"
    #: Idle past ``limit``: its units are released.
    RELEASE = "Release"


@attrs.frozen(kw_only=True)
class ExpiryStep:
    step: Expiry
    #: When the hold is (or was to be) released: ``idleSince + limit``.
    at: datetime
    limit: timedelta


def expiry(device: DeviceView, gpu_class: GPUClassView | None, running: bool, now: datetime) -> ExpiryStep | None:
    """Where ``device`` stands under its class's idle-hold rule now (None: nothing to say)."""
    if gpu_class is None or gpu_class.idle_hold_limit is None or running or not device.holds_units:
        return None
    idle_since = device.ledger.idle_since
    if idle_since is None or device.attachment is not None or device.deleting:
        return None  # a VMI attached: a start in progress, never taken from under it
    limit = gpu_class.idle_hold_limit
    at = idle_since + limit
    if now >= at:
        return ExpiryStep(step=Expiry.RELEASE, at=at, limit=limit)
    if gpu_class.idle_hold_warning > timedelta(0) and now >= at - gpu_class.idle_hold_warning:
        return ExpiryStep(step=Expiry.WARN, at=at, limit=limit)
    return None


def next_deadline(device: DeviceView, gpu_class: GPUClassView | None, now: datetime) -> datetime | None:
    """The next time ``expiry`` may change for an idle hold (its warning, then its release); None when never."""
    if gpu_class is None or gpu_class.idle_hold_limit is None or device.ledger.idle_since is None:
        return None
    at = device.ledger.idle_since + gpu_class.idle_hold_limit
    warn = at - gpu_class.idle_hold_warning
    for deadline in (warn, at):
        if deadline > now:
            return deadline
    return None


@attrs.frozen(kw_only=True)
class HoldFigures:
    """One hold's ledger at ``now``: its units, whether a VM runs on it, and its unit-seconds held and idle."""

    namespace: str
    name: str
    class_name: str
    units: int
    running: bool
    held_unit_seconds: float
    idle_unit_seconds: float
    held_since: datetime | None
    idle_since: datetime | None


def figures(snapshot: Snapshot, now: datetime) -> Iterator[HoldFigures]:
    """Every hold's figures (Bound devices; by the timestamps their status carries)."""
    for device in snapshot.devices.values():
        if not device.holds_units:
            continue
        ledger = device.ledger
        held = max((now - ledger.held_since).total_seconds(), 0.0) if ledger.held_since is not None else 0.0
        idle = ledger.idle_seconds + (max((now - ledger.idle_since).total_seconds(), 0.0)
                                      if ledger.idle_since is not None else 0.0)
        yield HoldFigures(namespace=device.namespace, name=device.name, class_name=device.class_name,
                          units=device.count, running=runs(snapshot, device), held_unit_seconds=held * device.count,
                          idle_unit_seconds=min(idle, held) * device.count, held_since=ledger.held_since,
                          idle_since=ledger.idle_since)


@attrs.define
class TenantFigures:
    """Units held, running and idle now in one tenant namespace for one class."""

    held: int = 0
    running: int = 0

    @property
    def idle(self) -> int:
        return self.held - self.running


def by_tenant(holds: Iterator[HoldFigures]) -> dict[tuple[str, str], TenantFigures]:
    """(namespace, class) -> its units held, running and idle now."""
    out: dict[tuple[str, str], TenantFigures] = {}
    for hold in holds:
        entry = out.setdefault((hold.namespace, hold.class_name), TenantFigures())
        entry.held += hold.units
        entry.running += hold.units if hold.running else 0
    return out
