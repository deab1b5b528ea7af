"""Process checks shared by the tests that start and stop processes."""

from __future__ import annotations

from pathlib import Path


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie waiting for whoever adopted it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"
