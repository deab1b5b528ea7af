"""The fake clock lives in ``cozygpu.base.clock``; this name stays for the tests that import it here."""

from __future__ import annotations

from cozygpu.base.clock import START, FakeClock, settle

__all__ = ["START", "FakeClock", "settle"]
