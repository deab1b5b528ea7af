"""``cozygpu usage`` without a cluster: the window arithmetic against true histories, the rows, the table and
the JSON, its flags, and ``kubectl gpu usage``'s translation."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cozygpu import cli
from cozygpu.commands import kubectl_plugin, usage
from cozygpu.commands.kubectl_plugin import Invocation, translate
from cozygpu.commands.usage import Spent, in_window
from cozygpu.model import ledger
from cozygpu.model.snapshot import DeviceView, Ledger, Phase, Snapshot
from tests.model.factories import NOW, device, gpu_class, gpu_nodes, pod, snapshot, vmi

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


@attrs.frozen
class History:
    """A hold's true life: when it began, and its periods (idle or not, seconds long) up to ``NOW``."""

    held_since: datetime
    periods: tuple[tuple[bool, int], ...]

    def intervals(self) -> list[tuple[datetime, datetime, bool]]:
        out, at = [], self.held_since
        for idle, seconds in self.periods:
            out.append((at, at + timedelta(seconds=seconds), idle))
            at += timedelta(seconds=seconds)
        return out

    def ledger(self) -> Ledger:
        """What the binder's status says of it: the open idle period's start, and the sum of the closed ones."""
        intervals = self.intervals()
        open_idle = intervals[-1][0] if intervals and intervals[-1][2] else None
        closed = intervals[:-1] if open_idle is not None else intervals
        return Ledger(held_since=self.held_since, idle_since=open_idle,
                      idle_seconds=float(sum((end - begin).total_seconds() for begin, end, idle in closed if idle)))

    def true_idle(self, start: datetime | None) -> float:
        """Seconds it was really idle in [start, NOW]."""
        lower = start or self.held_since
        return sum(max((end - max(begin, lower)).total_seconds(), 0.0) for begin, end, idle in self.intervals()
                   if idle)

    def closed_idle(self) -> bool:
        return self.ledger().idle_seconds > 0


@st.composite
def histories(draw: st.DrawFn) -> History:
    lengths = draw(st.lists(st.integers(min_value=1, max_value=3 * 86400), min_size=0, max_size=8))
    first_idle = draw(st.booleans())
    periods = tuple((first_idle == (i % 2 == 0), length) for i, length in enumerate(lengths))
    return History(held_since=NOW - timedelta(seconds=sum(lengths)), periods=periods)


WINDOWS = st.none() | st.integers(min_value=1, max_value=30 * 86400).map(lambda s: timedelta(seconds=s))
UNITS = st.integers(min_value=1, max_value=8)


def start_of(since: timedelta | None) -> datetime | None:
    return None if since is None else NOW - since


@given(histories(), WINDOWS, UNITS)
def test_held_is_the_overlap_and_idle_is_never_below_the_truth_nor_above_held(
        history: History, since: timedelta | None, units: int) -> None:
    spent = in_window(history.ledger(), units=units, now=NOW, start=start_of(since))
    lower = history.held_since if since is None else max(history.held_since, NOW - since)
    assert spent.held == pytest.approx(units * (NOW - lower).total_seconds())
    assert spent.idle >= units * history.true_idle(start_of(since)) - 1e-6
    assert spent.idle <= spent.held + 1e-6


@given(histories(), WINDOWS, UNITS)
def test_idle_is_exact_when_the_window_covers_the_hold_or_no_earlier_idle_period_exists(
        history: History, since: timedelta | None, units: int) -> None:
    covered = since is None or NOW - since <= history.held_since
    spent = in_window(history.ledger(), units=units, now=NOW, start=start_of(since))
    if covered or not history.closed_idle():
        assert spent.idle == pytest.approx(units * history.true_idle(start_of(since)), abs=1e-6)


@given(histories(), WINDOWS, WINDOWS, UNITS)
def test_a_longer_window_never_counts_less(history: History, one: timedelta | None, two: timedelta | None,
                                           units: int) -> None:
    def length(since: timedelta | None) -> timedelta:
        return since if since is not None else timedelta.max

    short, long_ = sorted((one, two), key=length)
    a = in_window(history.ledger(), units=units, now=NOW, start=start_of(short))
    b = in_window(history.ledger(), units=units, now=NOW, start=start_of(long_))
    assert a.held <= b.held + 1e-6
    assert a.idle <= b.idle + 1e-6


def test_the_earlier_idle_term_is_capped_by_the_held_time_in_the_window_before_the_open_idle_period() -> None:
    # Held 10 h, idle 3 h earlier (when, the status does not say), idle again for the last 2 h.
    held = Ledger(held_since=NOW - 10 * HOUR, idle_since=NOW - 2 * HOUR, idle_seconds=3 * 3600.0)
    assert in_window(held, units=2, now=NOW, start=None) == Spent(held=2 * 10 * 3600.0, idle=2 * 5 * 3600.0)
    assert in_window(held, units=2, now=NOW, start=NOW - 4 * HOUR) == Spent(held=2 * 4 * 3600.0,
                                                                           idle=2 * (2 + 2) * 3600.0)
    assert in_window(held, units=2, now=NOW, start=NOW - HOUR) == Spent(held=2 * 3600.0, idle=2 * 3600.0)
    running = Ledger(held_since=NOW - 10 * HOUR, idle_seconds=3 * 3600.0)
    assert in_window(running, units=1, now=NOW, start=NOW - 2 * HOUR) == Spent(held=7200.0, idle=7200.0)


def test_a_ledger_not_yet_written_spent_nothing_and_odd_timestamps_are_clamped_into_the_holds_life() -> None:
    assert in_window(Ledger(), units=4, now=NOW, start=None) == Spent(held=0.0, idle=0.0)
    before_held = Ledger(held_since=NOW - HOUR, idle_since=NOW - 5 * HOUR, idle_seconds=99999.0)
    assert in_window(before_held, units=1, now=NOW, start=None) == Spent(held=3600.0, idle=3600.0)
    future = Ledger(held_since=NOW - HOUR, idle_since=NOW + HOUR)
    assert in_window(future, units=1, now=NOW, start=None) == Spent(held=3600.0, idle=0.0)
    assert in_window(Ledger(held_since=NOW + HOUR), units=1, now=NOW, start=None) == Spent(held=0.0, idle=0.0)


A_DAY_HELD = Ledger(held_since=NOW - DAY)


def hold(name: str, *, namespace: str = "tenant-a", cls: str = "h100", count: int = 1,
         ledger_: Ledger = A_DAY_HELD, vmi_name: str | None = None) -> DeviceView:
    return attrs.evolve(device(name, namespace=namespace, cls=cls, count=count, phase=Phase.BOUND, node="n1",
                               vmi=vmi_name, vmi_uid="u" if vmi_name else ""), ledger=ledger_)


def world(*devices: DeviceView, running: str | None = None, namespace: str = "tenant-a") -> Snapshot:
    """Holds on n1; ``running``: a VMI of that name in ``namespace`` whose launcher runs."""
    nodes, inventories = gpu_nodes(("n1", 64))
    vmis = [vmi(running, namespace=namespace, uid="u", active=["p"])] if running else []
    pods = [pod("launcher", namespace=namespace, uid="p", claims_vmi=(namespace, running))] if running else []
    return snapshot(classes=[gpu_class("h100"), gpu_class("t4")], devices=devices, nodes=nodes,
                    inventories=inventories, vmis=vmis, pods=pods)


@given(histories(), UNITS)
def test_without_a_window_the_figures_are_the_ledgers_own(history: History, units: int) -> None:
    seen = world(hold("h", count=units, ledger_=history.ledger()))
    (row,) = usage.usage(seen, NOW)
    (figure,) = ledger.figures(seen, NOW)
    assert row.spent.held == pytest.approx(figure.held_unit_seconds)
    assert row.spent.idle == pytest.approx(figure.idle_unit_seconds)


def test_rows_per_namespace_and_class_count_units_held_running_and_idle_and_skip_what_holds_nothing() -> None:
    seen = world(
        hold("train", count=2, vmi_name="vm", ledger_=Ledger(held_since=NOW - 10 * HOUR, idle_seconds=3600.0)),
        hold("spare", count=1, ledger_=Ledger(held_since=NOW - 4 * HOUR, idle_since=NOW - 4 * HOUR)),
        hold("small", cls="t4", ledger_=Ledger(held_since=NOW - HOUR, idle_since=NOW - HOUR)),
        hold("other", namespace="tenant-b", count=3, ledger_=Ledger(held_since=NOW - 2 * HOUR,
                                                                     idle_since=NOW - HOUR)),
        device("waiting", count=5),
        running="vm")
    rows = usage.usage(seen, NOW)
    assert [(r.namespace, r.class_name, r.held, r.running, r.idle) for r in rows] == [
        ("tenant-a", "h100", 3, 2, 1), ("tenant-a", "t4", 1, 0, 1), ("tenant-b", "h100", 3, 0, 3)]
    assert [h.name for h in rows[0].holds] == ["spare", "train"]
    assert rows[0].spent == Spent(held=(2 * 10 + 4) * 3600.0, idle=(2 * 1 + 4) * 3600.0)
    assert rows[0].idle_share == pytest.approx(6 / 24)
    by_tenant = ledger.by_tenant(ledger.figures(seen, NOW))
    assert {(r.namespace, r.class_name): (r.held, r.running, r.idle) for r in rows} == {
        key: (f.held, f.running, f.idle) for key, f in by_tenant.items()}


def test_a_namespace_alone_or_with_its_tenant_children() -> None:
    seen = world(*(hold(ns, namespace=ns) for ns in ("tenant-a", "tenant-a-b", "tenant-a-b-c", "tenant-ab",
                                                      "tenant-root", "gpu-lab")))

    def names(namespace: str | None = None, *, subtree: bool = False) -> list[str]:
        return [row.namespace for row in usage.usage(seen, NOW, namespace=namespace, subtree=subtree)]

    assert names() == ["gpu-lab", "tenant-a", "tenant-a-b", "tenant-a-b-c", "tenant-ab", "tenant-root"]
    assert names(namespace="tenant-a") == ["tenant-a"]
    assert names(namespace="tenant-a", subtree=True) == ["tenant-a", "tenant-a-b", "tenant-a-b-c"]
    assert names(namespace="tenant-a-b", subtree=True) == ["tenant-a-b", "tenant-a-b-c"]
    assert len(names(namespace="tenant-root", subtree=True)) == 5, "every tenant but no plain namespace"
    assert names(namespace="gpu-lab", subtree=True) == ["gpu-lab"]


def test_the_json_is_sorted_rounded_and_names_the_window() -> None:
    seen = world(hold("b", count=2, ledger_=Ledger(held_since=NOW - 3 * HOUR, idle_since=NOW - HOUR)),
                 hold("a", ledger_=Ledger(held_since=NOW - 2 * DAY, idle_seconds=1.0 / 3)))
    rows = usage.usage(seen, NOW, since=DAY)
    doc = usage.as_json(rows, now=NOW, since="24h", namespace=None, subtree=False)
    assert json.loads(json.dumps(doc)) == doc
    (row,) = doc["rows"]
    assert {k: v for k, v in row.items() if k != "holds"} == {
        "namespace": "tenant-a", "class": "h100", "unitsHeld": 3, "unitsRunning": 0, "unitsIdle": 3,
        "gpuHoursHeld": 30.0, "gpuHoursIdle": 2.000093, "idleShare": 0.066670}
    assert row["holds"] == [
        {"name": "a", "units": 1, "running": False, "heldSince": "2026-11-30T12:00:00Z", "idleSince": None,
         "gpuHoursHeld": 24.0, "gpuHoursIdle": 0.000093},
        {"name": "b", "units": 2, "running": False, "heldSince": "2026-12-02T09:00:00Z",
         "idleSince": "2026-12-02T11:00:00Z", "gpuHoursHeld": 6.0, "gpuHoursIdle": 2.0}]
    assert (doc["now"], doc["since"], doc["namespace"], doc["subtree"]) == ("2026-12-02T12:00:00Z", "24h", None,
                                                                            False)


def test_the_table_reads_like_kubectl_top_and_names_the_window() -> None:
    seen = world(hold("b", count=2, ledger_=Ledger(held_since=NOW - 3 * HOUR, idle_since=NOW - HOUR)),
                 hold("c", namespace="tenant-ab", ledger_=Ledger(held_since=NOW)))
    assert usage.render_table(usage.usage(seen, NOW, since=2 * HOUR), since="2h").splitlines() == [
        "NAMESPACE   CLASS   HELD   RUNNING   IDLE   GPU-HOURS HELD (2h)   GPU-HOURS IDLE (2h)   IDLE SHARE",
        "tenant-a    h100    2      0         2      4.00                  2.00                  50%",
        "tenant-ab   h100    1      0         1      0.00                  0.00                  -",
    ]


@pytest.mark.parametrize(("text", "seconds"), [(None, None), ("24h", 86400.0), ("1h30m", 5400.0), ("90s", 90.0)])
def test_since_is_a_go_duration(text: str | None, seconds: float | None) -> None:
    window = usage.window(text)
    assert (None if window is None else window.total_seconds()) == seconds


@pytest.mark.parametrize(("argv", "says"), [
    (["--since", "yesterday"], "cozygpu usage: --since 'yesterday' is not a duration such as 24h or 90m\n"),
    (["--since", "0"], "cozygpu usage: --since '0' must be positive\n"),
    (["--since=-2h"], "cozygpu usage: --since '-2h' must be positive\n"),
])
def test_a_window_that_is_no_positive_duration_is_one_line_and_exit_code_2_before_reading_anything(
        capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    assert usage.main([*argv, "--kubeconfig", "/nonexistent"]) == 2
    assert capsys.readouterr() == ("", says)


def test_subtree_without_a_namespace_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        usage.main(["--subtree", "--kubeconfig", "/nonexistent"])
    assert done.value.code == 2
    assert "--subtree needs -n/--namespace" in capsys.readouterr().err


@pytest.mark.parametrize(("words", "argv"), [
    (["usage"], ()),
    (["usage", "-A"], ()),
    (["-n", "tenant-a", "usage", "--subtree", "--since", "24h", "-o", "json"],
     ("--namespace", "tenant-a", "--output", "json", "--subtree", "--since", "24h")),
    (["usage", "-A", "-o", "yaml"], ("--output", "json")),
])
def test_kubectl_gpu_usage_reads_one_namespace_with_n_and_every_one_without(
        words: list[str], argv: tuple[str, ...]) -> None:
    assert translate(words) == Invocation(verb="usage", argv=argv, yaml="yaml" in words)


def test_kubectl_gpu_usage_refuses_n_and_a_together(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl_plugin.main(["usage", "-n", "tenant-a", "-A"]) == 2
    assert capsys.readouterr() == ("", "kubectl gpu usage: -n and -A together: usage reads one namespace with -n, "
                                       "every namespace with -A; drop one\n")


def test_a_kubeconfig_that_does_not_exist_is_one_line_and_exit_code_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "kubeconfig"
    assert cli.main(["usage", "-n", "tenant-a", "--subtree", "--kubeconfig", str(missing)]) == 1
    assert capsys.readouterr() == ("", f"cozygpu usage: kubeconfig {missing}: no such file\n")
