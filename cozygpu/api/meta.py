"""An object's metadata and sections, read from its JSON without a ``KeyError`` whatever a client wrote.

Every reader returns a typed value: a missing or mistyped field reads as
empty ("" / None / () / {}), never raises. The objects are the cache's
(frozen mappings) or a webhook's request: nothing here mutates them.
"""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cozygpu.api.times import parse_time

Obj = Mapping[str, Any]
EMPTY: Mapping[str, Any] = {}


def section(obj: Obj | None, name: str) -> Mapping[str, Any]:
    """``obj[name]`` when it is a mapping, else an empty one (``spec``, ``status``, ``metadata``…)."""
    if obj is None:
        return EMPTY
    value = obj.get(name)
    return value if isinstance(value, Mapping) else EMPTY


def metadata(obj: Obj | None) -> Mapping[str, Any]:
    return section(obj, "metadata")


def spec(obj: Obj | None) -> Mapping[str, Any]:
    return section(obj, "spec")


def status(obj: Obj | None) -> Mapping[str, Any]:
    return section(obj, "status")


def text(mapping: Mapping[str, Any], field: str) -> str:
    """``mapping[field]`` as a string ("" when missing or not a string)."""
    value = mapping.get(field)
    return value if isinstance(value, str) else ""


def kind(obj: Obj | None) -> str:
    """The object's ``kind`` ("" for none: a delete may answer with a Status rather than the object)."""
    return text(obj, "kind") if obj is not None else ""


def name(obj: Obj | None) -> str:
    return text(metadata(obj), "name")


def namespace(obj: Obj | None) -> str:
    return text(metadata(obj), "namespace")


def key(obj: Obj | None) -> tuple[str, str]:
    """(namespace, name); "" for a missing part."""
    meta = metadata(obj)
    return (text(meta, "namespace"), text(meta, "name"))


def uid(obj: Obj | None) -> str:
    return text(metadata(obj), "uid")


def resource_version(obj: Obj | None) -> str:
    """The version a write's precondition names ("" for an object never stored)."""
    return text(metadata(obj), "resourceVersion")


def generation(obj: Obj | None) -> int | None:
    value = metadata(obj).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def finalizers(obj: Obj | None) -> tuple[str, ...]:
    value = metadata(obj).get("finalizers")
    return tuple(f for f in value if isinstance(f, str)) if isinstance(value, list | tuple) else ()


def deleting(obj: Obj | None) -> bool:
    """The object carries a deletionTimestamp (it goes once its finalizers are gone)."""
    return bool(metadata(obj).get("deletionTimestamp"))


def deletion_time(obj: Obj | None) -> datetime | None:
    return parse_time(metadata(obj).get("deletionTimestamp"))


def creation_time(obj: Obj | None) -> datetime | None:
    return parse_time(metadata(obj).get("creationTimestamp"))


def labels(obj: Obj | None) -> Mapping[str, str]:
    return _strings(metadata(obj).get("labels"))


def annotations(obj: Obj | None) -> Mapping[str, str]:
    return _strings(metadata(obj).get("annotations"))


def owner_references(obj: Obj | None) -> tuple[Mapping[str, Any], ...]:
    value = metadata(obj).get("ownerReferences")
    return tuple(o for o in value if isinstance(o, Mapping)) if isinstance(value, list | tuple) else ()


def items(value: object) -> tuple[Mapping[str, Any], ...]:
    """The mappings of a JSON list (anything else in it, or a non-list, left out)."""
    return tuple(v for v in value if isinstance(v, Mapping)) if isinstance(value, list | tuple) else ()


def _strings(value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        return EMPTY
    return {str(k): v for k, v in value.items() if isinstance(v, str)}
