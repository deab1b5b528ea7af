"""The project's one source of randomness: every jitter and spread draws from a ``Random`` handed in."""

from __future__ import annotations

import ast
import random
from pathlib import Path

from cozygpu.base.backoff import JITTER_FACTOR, jittered, spread

PACKAGE = Path(__file__).resolve().parents[2] / "cozygpu"
#: The one module that may import ``random`` (and the local plane's harness, which picks free ports).
ALLOWED = {"base/backoff.py", "devcluster/plane.py"}


def test_only_the_backoff_module_imports_random() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if "random" in names and str(path.relative_to(PACKAGE)) not in ALLOWED:
                found.append(str(path.relative_to(PACKAGE)))
    assert found == [], f"random imported outside the backoff module: {found}"


class Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def test_a_spread_covers_its_bounds_evenly_and_a_jitter_stretches_by_at_most_its_factor() -> None:
    assert spread(300, 600, Fixed(0.0)) == 300
    assert spread(300, 600, Fixed(0.999999)) == 600
    seeded = random.Random(3)
    seen = {spread(1, 3, seeded) for _ in range(200)}
    assert seen == {1, 2, 3}
    assert jittered(2.0, Fixed(0.0)) == 2.0
    assert jittered(2.0, Fixed(1.0)) == 2.0 + JITTER_FACTOR * 2.0
