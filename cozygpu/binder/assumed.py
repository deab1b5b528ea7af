"""What the binder's passes share of their writes: a device's key, and the refusal that requeues a pass.

The binder's own writes, read back until the cache shows them (R-BIND-2), are
the read model's overlay (``cozygpu.views.readmodel.Assumed``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cozygpu.api import meta
from cozygpu.kube import errors
from cozygpu.model.snapshot import DeviceKey


def object_key(obj: Mapping[str, Any]) -> DeviceKey:
    """(namespace, name) of an object ("" for a missing part)."""
    return meta.key(obj)


class StaleWrites(errors.Conflict):
    """Some writes of the pass were refused on their resourceVersion: the pass is requeued, not failed."""

    def __init__(self, count: int) -> None:
        self.count = count
        super().__init__(409, {"reason": "Conflict", "message": f"{count} write(s) refused on the resourceVersion "
                               "they were decided on; the pass runs again from a fresh view"})
