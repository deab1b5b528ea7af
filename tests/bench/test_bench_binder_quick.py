"""Smoke test of ``bench/bench_binder.py --quick``: it runs end to end against its own control plane and prints
every figure, each pass split where the binder calls its steps. No timing is asserted (a probe that stopped
matching the binder's code, as when its shared context became a slotted class, fails the run here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cozygpu.devcluster import binaries
from tests.support.planes import unavailable

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "bench" / "bench_binder.py"
MS = r"p50 [0-9.]+ ms, p99 [0-9.]+ ms, max [0-9.]+ ms \(n=[0-9]+\)"


def test_the_binder_bench_runs_quick_and_prints_every_figure() -> None:
    if binaries.find(binaries.DEFAULT_MINOR) is None:
        unavailable("control-plane binaries missing")
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for line in (rf"answer latency, idle  : {MS}", rf"answer latency, during: {MS}",
                 rf"housekeeping pass \(writing nothing\): {MS}",
                 r"of which \(median\): snapshot [0-9.]+ ms, plan [0-9.]+ ms, writes [0-9.]+ ms",
                 rf"new order \(create -> Bound seen\): {MS}; bound by lane: \{{'placement': [0-9]+, "
                 r"'housekeeping': [0-9]+\}", r"controller RSS: [0-9]+ MB"):
        assert re.search(line, out), (line, out[-3000:])
    split = out[out.index("where an idle answer's time goes"):]
    for step in ("write -> binder cache", "cache -> pass start", "snapshot", "plan", "plan_writes", "writes (API)"):
        assert re.search(rf"  {re.escape(step)} +[0-9.]+ ms +[0-9.]+ ms", split), (step, split)
