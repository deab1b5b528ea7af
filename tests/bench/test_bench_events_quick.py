"""Smoke test of ``bench/bench_events.py`` at a tiny size: it runs in-process end to end and prints every row.

Only the structure of the output is checked (each event kind has its row in
the size's table, the issue's table and the fold table; the snapshot builds
and every target have their line) and that the bench's rig asked for
placement, and ran a placement pass, where a row is an answer; no timing is asserted.
"""

from __future__ import annotations

import re

import pytest

from bench import bench_events

FIGURE = r"(—|[0-9][0-9,]*(\.[0-9]+)?)"


async def test_the_events_bench_runs_at_a_tiny_size_and_prints_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    results = await bench_events.run([50], reps=1)
    out = capsys.readouterr().out
    size = out[out.index("## N=50"):out.index("## every pass each event causes")]
    issue = out[out.index("## every pass each event causes"):out.index("## folding the event")]
    folds = out[out.index("## folding the event"):out.index("## targets")]
    for kind in bench_events.KINDS:
        label = re.escape(kind.label)
        assert re.search(rf"\| {label} \| {FIGURE} \| [01]/1 \| [01]/1 \| {FIGURE} \| {FIGURE} \| [0-9]+: "
                         rf"([a-z]+(/[a-z]+)*|—) \|", size), (kind.label, size)
        assert re.search(rf"\| {label} \| ({FIGURE}|no pass \([01]/1 fired\)) \| (—|[0-9.]+×) \|", issue), \
            (kind.label, issue)
        assert re.search(rf"\| {label} \| {FIGURE} \| [0-9.]+× \|", folds), (kind.label, folds)
    assert re.search(rf"\| from-scratch snapshot build \(a fresh LiveSnapshot\) \| \| \| \| \| {FIGURE} \|", size)
    assert re.search(rf"\| snapshot rebuild, warm memo \(a view changed\) \| \| \| \| \| {FIGURE} \|", size)
    assert re.search(rf"\| from-scratch snapshot build \| {FIGURE} \| [0-9.]+× \|", issue)
    targets = out[out.index("## targets"):]
    for line in ("- a heartbeat starts no cycle:", "- one Node label change at 5,000", "- one bind request at 50",
                 "- one new order at 50", "- from-scratch build at 50"):
        assert line in targets, targets
    (result,) = results
    for kind in (k for k in bench_events.KINDS if k.answer):
        row = result.row(kind.label)
        assert row.answered == 1, (kind.label, row.samples)
        assert row.placement_ms is not None, (kind.label, row.samples)
        assert row.lane.startswith("placement"), (kind.label, row.samples)
