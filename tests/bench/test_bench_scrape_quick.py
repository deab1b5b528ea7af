"""Smoke test of ``bench/bench_scrape.py`` at tiny sizes: it runs end to end and prints every figure. No timing
is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "bench" / "bench_scrape.py"
LATE = r"p50 +[0-9.]+ +p99 +[0-9.]+ +max +[0-9.]+ ms"


def test_the_scrape_bench_runs_and_prints_every_figure() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "40,80", "--reps", "2", "--seconds", "0.5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for n in (40, 80):
        assert re.search(rf"N={n}: library [0-9.]+ ms \([0-9.]+ MB\); ours, first scrape [0-9.]+ ms \([0-9.]+ MB\); "
                         rf"ours, next scrape [0-9.]+ ms; library ÷ ours \(next\) [0-9]+×", out), out
    for what in ("no scrapes", "library", "ours"):
        assert len(re.findall(rf"beside a scrape a second, +{what}: {LATE}", out)) == 2, (what, out)
    assert re.search(r"growth 40 -> 80 nodes: library [0-9.]+×, ours \(next scrape\) [0-9.]+×", out), out
