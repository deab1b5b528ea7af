"""A GPUClass's JSON as the binder reads it (the typed view the model uses is ``views.decode``'s)."""

from __future__ import annotations

from cozygpu.api.meta import Obj, spec, text


def resource_name(obj: Obj | None) -> str:
    """``spec.resourceName``: the extended resource a held device of the class is accounted under ("" if none)."""
    return text(spec(obj), "resourceName")
