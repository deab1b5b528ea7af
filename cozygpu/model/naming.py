"""Names of template devices (R-MOD-10).

Why: the VMI webhook creates one GPUDevice per template reference of a VMI,
and on re-invocation it must find the same devices again, so the name is a
pure function of the VMI name and the template name. The template-device
label carries no VMI name (label values are too short), so the name is the
only link a person sees.

Contract:
- ``<vmi>-<template>-<hash>``: a readable prefix (the two names joined by
  '-', lower-cased, cut and cleaned to a valid label), then '-' and 10 hex
  digits of a SHA-256 over the exact (vmi, template) pair.
- The hash is always there: the plain join alone is ambiguous across VMIs
  (``a-b`` + ``c`` and ``a`` + ``b-c`` both read ``a-b-c``), and since the
  template-device label carries no VMI name, two VMIs of one namespace would
  then want the same GPUDevice.
The result is always a valid DNS subdomain and also a valid label value
(63 characters at most, so usage records may carry it), stable across
releases, and distinct for distinct (vmi, template) pairs.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 63
HASH_CHARS = 10
_INVALID = re.compile(r"[^a-z0-9-]+")


def _digest(vmi_name: str, template_name: str) -> str:
    material = f"{vmi_name}\x00{template_name}".encode()
    return hashlib.sha256(material).hexdigest()[:HASH_CHARS]


def template_device_name(vmi_name: str, template_name: str) -> str:
    plain = f"{vmi_name}-{template_name}"
    cleaned = _INVALID.sub("-", plain.lower())
    prefix = cleaned[: MAX_NAME - HASH_CHARS - 1].strip("-")
    suffix = _digest(vmi_name, template_name)
    return f"{prefix}-{suffix}" if prefix else suffix
