"""``python -m cozygpu``: the same entry point as the ``cozygpu`` command."""

from __future__ import annotations

from cozygpu.cli import main

raise SystemExit(main())
