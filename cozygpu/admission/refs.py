"""The device-refs contract: the VMI annotation the chart writes and the VMI webhook reads (SPEC §1.4, R-DEP).

The annotation ``gpu.cozystack.io/device-refs`` is a JSON list whose entries
are ``{"device": NAME}`` (a GPUDevice of the VMI's namespace, held by the
tenant) or ``{"template": NAME, "class": CLASS, "count": N}`` (a device the
webhook creates for this VMI and the binder deletes with it).

Contract: :func:`parse_refs` returns the references in order, or raises
``RefsError`` whose message names the bad entry (its index and what is wrong
with it). Nothing is guessed: an unknown key, a wrong type, a duplicate, an
empty list or a name that cannot be a Kubernetes name is refused.

Bounded (issue 22): the text is at most ``bounds.MAX_REFS_TEXT`` characters
and the list at most ``MAX_REFS`` entries, both checked before the entries
are read; a message quotes a bad value cut short (``bounds.describe``), never
a repr of a whole structure (which could be a megabyte, or nested deep enough
to exhaust the recursion limit).
"""

from __future__ import annotations

import re
from typing import Final

import attrs
import orjson

from cozygpu import keys
from cozygpu.admission import bounds
from cozygpu.api import device_refs
from cozygpu.model import refusals

#: More references than a VM could hold GPUs for is a mistake, not a request.
MAX_REFS: Final = 32
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class RefsError(ValueError):
    """The annotation cannot be read; the message names the entry."""


@attrs.frozen
class DeviceRef:
    """A held GPUDevice, by name."""

    device: str


@attrs.frozen
class TemplateRef:
    """A device created for this VMI: ``count`` GPUs of ``class_name``."""

    template: str
    class_name: str
    count: int


Ref = DeviceRef | TemplateRef


def _name(value: object, *, where: str, field: str, label: bool = False) -> str:
    if not isinstance(value, str) or not value:
        raise RefsError(f"{where}: {field!r} must be a non-empty string, not {bounds.describe(value)}")
    pattern, limit = (_LABEL, 63) if label else (_SUBDOMAIN, 253)
    if len(value) > limit or not pattern.fullmatch(value):
        kind = "DNS label" if label else "DNS subdomain"
        raise RefsError(f"{where}: {field} {bounds.describe(value)} is not a {kind} (lower-case alphanumerics "
                        f"and '-', at most {limit})")
    return value


def _entry(index: int, raw: object) -> Ref:
    where = f"entry {index}"
    if not isinstance(raw, dict):
        raise RefsError(f"{where}: must be an object, not {bounds.describe(raw)}")
    read = device_refs.entry(raw)
    fields = read.fields
    if fields == device_refs.DEVICE_FIELDS:
        return DeviceRef(_name(read.device, where=where, field=device_refs.DEVICE))
    if device_refs.TEMPLATE in fields:
        unknown = fields - device_refs.TEMPLATE_FIELDS
        if unknown:
            shown = ", ".join(bounds.clip(key) for key in sorted(unknown)[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise RefsError(f"{where}: unknown field(s) {shown}{more}")
        missing = device_refs.TEMPLATE_FIELDS - fields
        if missing:
            raise RefsError(f"{where}: template {bounds.describe(read.template)} needs "
                            f"{' and '.join(sorted(missing))}")
        count = read.count
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise RefsError(f"{where}: count must be a whole number of at least 1, not {bounds.describe(count)}")
        return TemplateRef(_name(read.template, where=where, field=device_refs.TEMPLATE, label=True),
                           _name(read.class_name, where=where, field=device_refs.CLASS, label=True), count)
    shown = ", ".join(bounds.clip(key) for key in sorted(fields)[:5])
    more = f" and {len(fields) - 5} more" if len(fields) > 5 else ""
    raise RefsError(f"{where}: must be {{\"device\": NAME}} or {{\"template\": NAME, \"class\": CLASS, "
                    f"\"count\": N}}, not an object of fields {shown or '(none)'}{more}")


def parse_refs(text: object) -> tuple[Ref, ...]:
    """The references of a VMI's ``device-refs`` annotation (see the module contract)."""
    what = f"annotation {keys.DEVICE_REFS_ANNOTATION}"
    if not isinstance(text, str):
        raise RefsError(f"{what} is missing; a VMI labelled {keys.DEVICE_REFS_LABEL} must carry it")
    if len(text) > bounds.MAX_REFS_TEXT:
        raise RefsError(refusals.over_limit(what, "text", limit=bounds.MAX_REFS_TEXT, found=len(text),
                                            unit="characters").message)
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise RefsError(f"{what} is not JSON: {error}") from None
    if not isinstance(raw, list):
        raise RefsError(f"{what} must be a JSON list, not {type(raw).__name__}")
    if not raw:
        raise RefsError(f"{what} is an empty list: name at least one device or template")
    if len(raw) > MAX_REFS:
        raise RefsError(f"{what} has {len(raw)} entries; at most {MAX_REFS}")
    refs = tuple(_entry(i, entry) for i, entry in enumerate(raw))
    seen: set[tuple[str, str]] = set()
    for index, ref in enumerate(refs):
        key = ("device", ref.device) if isinstance(ref, DeviceRef) else ("template", ref.template)
        if key in seen:
            raise RefsError(f"{what}: entry {index}: {key[0]} {key[1]!r} is named twice")
        seen.add(key)
    return refs
