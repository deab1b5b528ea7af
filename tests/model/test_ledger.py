"""The hold ledger (R-LEDGER-1, R-LEDGER-2): what a hold's status must say, where its class's rule puts it, and
the figures derived from its timestamps alone."""

from __future__ import annotations

from datetime import timedelta

import attrs
import hypothesis
from hypothesis import strategies as hst

from cozygpu.model import ledger
from cozygpu.model.snapshot import DeviceView, GPUClassView, Ledger, Phase
from tests.model.factories import NOW, device, gpu_class, gpu_nodes, pod, snapshot, vmi

HOUR = timedelta(hours=1)


def hold(name: str = "h", *, count: int = 1, ledger_: Ledger | None = None, vmi_name: str | None = None) -> DeviceView:
    found = device(name, count=count, phase=Phase.BOUND, node="n0", vmi=vmi_name)
    return attrs.evolve(found, ledger=ledger_) if ledger_ is not None else found


def limited(limit: timedelta | None = 10 * HOUR, warning: timedelta = 2 * HOUR) -> GPUClassView:
    return attrs.evolve(gpu_class(), idle_hold_limit=limit, idle_hold_warning=warning)


def test_a_first_look_at_a_hold_sets_held_and_idle_since_now() -> None:
    assert ledger.target(hold(), False, NOW) == Ledger(held_since=NOW, idle_since=NOW, idle_seconds=0.0)
    assert ledger.target(hold(), True, NOW) == Ledger(held_since=NOW, idle_since=None, idle_seconds=0.0)


def test_a_vm_starting_ends_the_idle_period_into_idle_seconds_and_stopping_opens_a_new_one() -> None:
    idle = Ledger(held_since=NOW - 5 * HOUR, idle_since=NOW - 2 * HOUR, idle_seconds=600.0)
    started = ledger.target(hold(ledger_=idle), True, NOW)
    assert started == Ledger(held_since=NOW - 5 * HOUR, idle_since=None, idle_seconds=600.0 + 7200.0)
    stopped = ledger.target(hold(ledger_=started), False, NOW + HOUR)
    assert stopped == attrs.evolve(started, idle_since=NOW + HOUR)
    assert ledger.target(hold(ledger_=stopped), False, NOW + 3 * HOUR) == stopped, "nothing moved: nothing to write"


def test_the_rule_warns_after_limit_less_warning_and_releases_at_the_limit() -> None:
    cls = limited()
    idle_for = {h: hold(ledger_=Ledger(held_since=NOW - 20 * HOUR, idle_since=NOW - h * HOUR)) for h in (7, 8, 10, 11)}
    assert ledger.expiry(idle_for[7], cls, False, NOW) is None
    warned = ledger.expiry(idle_for[8], cls, False, NOW)
    assert warned is not None
    assert (warned.step, warned.at) == (ledger.Expiry.WARN, NOW + 2 * HOUR)
    for h in (10, 11):
        released = ledger.expiry(idle_for[h], cls, False, NOW)
        assert released is not None
        assert released.step is ledger.Expiry.RELEASE
    assert ledger.next_deadline(idle_for[7], cls, NOW) == NOW + HOUR
    assert ledger.next_deadline(idle_for[8], cls, NOW) == NOW + 2 * HOUR
    assert ledger.next_deadline(idle_for[11], cls, NOW) is None


def test_the_rule_never_touches_a_running_or_attached_hold_or_a_class_without_a_limit() -> None:
    old = Ledger(held_since=NOW - 99 * HOUR, idle_since=NOW - 50 * HOUR)
    assert ledger.expiry(hold(ledger_=old), limited(), True, NOW) is None, "a VM runs on it"
    assert ledger.expiry(hold(ledger_=old, vmi_name="starting"), limited(), False, NOW) is None, "a start attached it"
    assert ledger.expiry(hold(ledger_=old), limited(None), False, NOW) is None
    assert ledger.expiry(hold(ledger_=old), None, False, NOW) is None


def test_figures_count_unit_seconds_from_the_timestamps_and_running_from_the_launcher() -> None:
    nodes, inventories = gpu_nodes(("n0", 8))
    running = attrs.evolve(device("run", count=2, phase=Phase.BOUND, node="n0", vmi="vm", vmi_uid="u"),
                           ledger=Ledger(held_since=NOW - 3 * HOUR, idle_seconds=1800.0))
    idle = hold("idle", count=3, ledger_=Ledger(held_since=NOW - 2 * HOUR, idle_since=NOW - HOUR, idle_seconds=600.0))
    world = snapshot(
        now=NOW, classes=[gpu_class()], nodes=nodes, inventories=inventories,
        devices=[running, idle, device("pending", count=4)],
        vmis=[vmi("vm", uid="u", active=["uid-launcher"])],
        pods=[pod("launcher", node_name="n0", uid="uid-launcher", claims_vmi=("tenant-a", "vm"))])
    found = {f.name: f for f in ledger.figures(world, NOW)}
    assert {key for key, d in world.devices.items() if ledger.runs(world, d)} == ledger.running_holds(world) == {
        ("tenant-a", "run")}, "one hold's test and the fleet's agree"
    assert set(found) == {"run", "idle"}, "a Pending order holds nothing"
    assert (found["run"].running, found["run"].held_unit_seconds, found["run"].idle_unit_seconds) == (
        True, 2 * 3 * 3600.0, 2 * 1800.0)
    assert (found["idle"].running, found["idle"].held_unit_seconds, found["idle"].idle_unit_seconds) == (
        False, 3 * 2 * 3600.0, 3 * (600.0 + 3600.0))
    tenants = ledger.by_tenant(iter(found.values()))
    assert [(k, v.held, v.running, v.idle) for k, v in tenants.items()] == [(("tenant-a", "h100"), 5, 2, 3)]


@hypothesis.given(hst.lists(hst.tuples(hst.booleans(), hst.integers(1, 3600)), min_size=1, max_size=12))
def test_unit_seconds_never_go_back_whatever_the_vm_does(steps: list[tuple[bool, int]]) -> None:
    """A hold's VM starts and stops at random; after each ledger write (``target``) and in between, the held
    and idle unit-seconds never decrease, idle never exceeds held, and idle grows only while no VM runs."""
    nodes, inventories = gpu_nodes(("n0", 8))
    current = hold(count=2)
    at = NOW
    last = (0.0, 0.0)
    for vm_runs, seconds in steps:
        current = attrs.evolve(current, ledger=ledger.target(current, vm_runs, at))
        for now in (at, at + timedelta(seconds=seconds)):
            world = snapshot(now=now, classes=[gpu_class()], nodes=nodes, inventories=inventories, devices=[current])
            [figures] = ledger.figures(world, now)
            assert figures.held_unit_seconds >= last[0]
            assert figures.idle_unit_seconds >= last[1]
            assert figures.idle_unit_seconds <= figures.held_unit_seconds
            if vm_runs:
                assert figures.idle_unit_seconds == last[1], "no idle time while a VM runs"
            last = (figures.held_unit_seconds, figures.idle_unit_seconds)
        at += timedelta(seconds=seconds)
