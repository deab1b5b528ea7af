"""Smoke test of ``bench/compare_scheduler.py`` at a tiny size: it runs end to end and prints its table.

Only the structure of the output is checked (every system has a row with
four figures, the burst's wall time and its ratios to the floor; the ratios
to A, the node search, the answer-path profile, the controller's requests);
no timing is asserted. It runs with ``--dra``, so the DRA rows are checked
too (A-DRA, B-DRA Bound and its hold claim allocated, their ratios to A-DRA,
the hold's path, the same figures in the JSON). It starts its own full plane
and controller process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from cozygpu.devcluster import binaries
from tests.support.planes import unavailable

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "bench" / "compare_scheduler.py"
NUMBER = r"[0-9]+\.[0-9]"


def test_the_side_by_side_bench_runs_at_a_tiny_size_and_prints_every_row(tmp_path: Path) -> None:
    if binaries.find(binaries.DEFAULT_MINOR) is None:
        unavailable("control-plane binaries missing")
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "10", "--samples", "8", "--burst", "8", "--rounds", "2",
         "--dra", "--json", str(figures)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    table = out[out.index("## the table"):]
    for label in ("floor (ConfigMap → watch)", "A kube-scheduler", "B binder", "C VM start",
                  "C step: answer → launcher pod created", "C step: → placed (kube-scheduler)",
                  "C step: → pod Running (kwok)", "C step: → VMI Running seen", "A-DRA kube-scheduler (claim)",
                  "B-DRA binder (Bound)", "B-DRA hold claim allocated"):
        burst = r"[0-9]+( \([0-9]+ refused\))?"
        row = rf"\| 10 \| {re.escape(label)} \| 8 \|( {NUMBER}+ \|){{4}} {burst} \| {NUMBER}+ / {NUMBER}+ \|"
        assert re.search(row, table), (label, table[:2000])
    assert re.search(rf"\| 10 \| B/A \|( {NUMBER}+ \|){{5}}", table)
    assert re.search(rf"\| 10 \| C/A \|( {NUMBER}+ \|){{5}}", table)
    assert re.search(rf"\| 10 \| B-DRA/A-DRA \|( {NUMBER}+ \|){{5}}", table)
    assert re.search(rf"\| 10 \| B-DRA hold/A-DRA \|( {NUMBER}+ \|){{5}}", table)
    assert "where an order's time goes (B-DRA), N=10" in out
    assert re.search(rf"where a DRA hold's time goes [^\n]*N=10, [0-9]+ orders one at a time.*?"
                     rf"total: create → allocation seen here +{NUMBER}+", out, re.S)
    assert "percentageOfNodesToScore 100% -> 10 nodes" in out
    assert "where an order's time goes (B), N=10" in out
    assert "with the controller frozen" in out
    assert re.search(r"this process's event-loop lag over N=10 .*: [0-9]+ wake-ups, p99 under", out)
    assert re.search(r"an idle uvloop process's lag over the same spans .*: [1-9][0-9]* wake-ups, p99 under", out)
    assert "## the controller's API requests" in out
    written = json.loads(figures.read_text())
    assert {"A-DRA", "B-DRA", "B-DRA hold"} <= set(written["results"]["10"]["one"])
    assert {"A-DRA", "B-DRA", "B-DRA hold"} <= set(written["results"]["10"]["burst"])
    assert "10 one" in written["holds"]
    assert written["results"]["10"]["idle_lag"]["ticks"] > 0
