"""Go-style durations (``1m30s``, ``500ms``, ``2h``), as every cozygpu flag takes them.

One parser for the controller's and the agent's flags (see ``cozygpu.base.flags``),
so ``--bind-wait 10s`` and ``--interval 15s`` mean the same thing everywhere.
"""

from __future__ import annotations

import re
from typing import Final

_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_TERM: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds of a Go duration string (``1m30s``, ``-2s``, ``0``); ValueError otherwise."""
    s = text.strip()
    sign = 1.0
    if s[:1] in {"+", "-"}:
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError("not a duration")
    total = 0.0
    pos = 0
    while pos < len(s):
        match = _TERM.match(s, pos)
        if match is None:
            raise ValueError("not a duration")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    return sign * total


def format_duration(seconds: float) -> str:
    """The shortest Go-style spelling of whole-millisecond durations, for messages and docs."""
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms"
    s = ms // 1000
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{sec}s" if sec else "")
    return out or "0s"
