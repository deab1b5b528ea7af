"""The ``gpu.cozystack.io/device-refs`` annotation's entries, read as written (``cozygpu.admission.refs`` checks them).

An entry is ``{"device": NAME}`` or ``{"template": NAME, "class": CLASS,
"count": N}``; :func:`entry` reads its fields without judging them, so the
checker can name what is wrong with each value as the tenant wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

DEVICE: Final = "device"
TEMPLATE: Final = "template"
CLASS: Final = "class"
COUNT: Final = "count"
#: The fields of each shape.
DEVICE_FIELDS: Final = frozenset({DEVICE})
TEMPLATE_FIELDS: Final = frozenset({TEMPLATE, CLASS, COUNT})


@attrs.frozen(kw_only=True)
class Entry:
    """One entry's field names and the values of the known ones (None when absent), unchecked."""

    fields: frozenset[str]
    device: object
    template: object
    class_name: object
    count: object


def entry(raw: Mapping[str, Any]) -> Entry:
    """The fields of one entry (a JSON object of the parsed annotation; its text is bounded before parsing)."""
    return Entry(fields=frozenset(str(k) for k in raw), device=raw.get(DEVICE), template=raw.get(TEMPLATE),
                 class_name=raw.get(CLASS), count=raw.get(COUNT))
