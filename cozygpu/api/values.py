"""JSON values as a client wrote them, read as the type a reader expects without copying or walking them.

A reader of a tenant's object checks a list's length before it reads an
entry (``admission/bounds.py``), so nothing here iterates: a list reads as
itself (``len`` costs nothing) and a mapping as itself; anything else reads
as empty, or as None where a reader must tell "missing or mistyped" apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cozygpu.api.meta import EMPTY


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    # dict first, None next: parsed JSON and the cache's objects are dicts, a missing field is None,
    # and the Mapping ABC check is slow for everything else.
    if isinstance(value, dict):
        return value
    return value if value is not None and isinstance(value, Mapping) else EMPTY


def mapping_or_none(value: object) -> Mapping[str, Any] | None:
    """``value`` when it is a JSON object, else None (a patch must create it)."""
    if isinstance(value, dict):
        return value
    return value if value is not None and isinstance(value, Mapping) else None


def array(value: object) -> Sequence[Any]:
    """``value`` when it is a JSON list (not copied: its length is free), else an empty one."""
    return value if isinstance(value, list | tuple) else ()


def array_or_none(value: object) -> Sequence[Any] | None:
    """``value`` when it is a JSON list, else None (a patch must create it)."""
    return value if isinstance(value, list | tuple) else None


def string(value: object) -> str:
    """``value`` when it is a string, else ""."""
    return value if isinstance(value, str) else ""


def whole(value: object) -> int | None:
    """``value`` when it is a JSON integer (a boolean is not one), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None
