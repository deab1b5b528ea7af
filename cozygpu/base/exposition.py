"""The Prometheus text format (0.0.4), written directly, for families with a series per node or per hold.

prometheus_client renders a sample in about 18 µs (label validation, escaping,
its own float formatting): at a fleet's size that is a tenth of a second or
more a scrape, on a thread that takes the interpreter lock from the event loop
in 5 ms slices. The families that scale with the fleet render themselves with
these helpers, a few µs a line, and the ``/metrics`` handler serves them after
the registry's (``runtime.servers.metrics_app``). What they write reads back
the same through Prometheus's text parser as the library's rendering of the
same families (a test checks each family).

Contract: ``header`` gives a family's ``# HELP`` and ``# TYPE`` lines (for a
counter the name carries ``_total``, as the library writes it); ``labels``
joins label pairs escaped; ``number`` is a sample's value.
"""

from __future__ import annotations

import math


def header(name: str, documentation: str, kind: str) -> bytes:
    """A family's two comment lines; ``kind`` is ``gauge`` or ``counter`` (whose name gains ``_total``)."""
    shown = f"{name}_total" if kind == "counter" else name
    text = documentation.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {shown} {text}\n# TYPE {shown} {kind}\n".encode()


def escaped(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(*pairs: tuple[str, str]) -> str:
    """``{name="value",...}``, the values escaped, in the order given."""
    return "{" + ",".join(f'{name}="{escaped(value)}"' for name, value in pairs) + "}"


def number(value: float) -> str:
    """A sample's value: Python's shortest round-trip form, which Prometheus parses; ±Inf and NaN spelled
    as it wants them."""
    value = float(value)
    if math.isfinite(value):
        return repr(value)
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
