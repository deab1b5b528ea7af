"""What one admission request may carry, so that every answer costs about the same (issue 22).

Why: a webhook answer on every replica shares one event loop. Work that grows
with a number, a length or a count a tenant writes (a template count of
3,000,000, ten thousand ``gpus`` entries, a name of a megabyte, a body of
millions of empty lists) stalls every tenant's admission on that replica.
So each of those is compared with a limit **before** anything sized by it is
built, and a request over a limit is refused with a message naming the
object, the limit and the number (``refusals.over_limit``).

The limits, and why each number (docs/admission.md, "Bounds"):

- ``MAX_BODY`` (envelope): 7 MiB, controller-runtime's figure, read whole.
- ``MAX_JSON_ITEMS``: 50,000 JSON containers and commas in the body, counted
  before it is parsed. Parsing costs about what it builds: 50,000 items parse
  in ~2-5 ms, while 2 million empty lists took 0.7 s. A launcher pod or a VMI
  has a few thousand. The count includes commas and brackets inside strings,
  so it only over-estimates.
- ``MAX_JSON_DEPTH``: 1024, orjson's own limit; deeper is refused by the
  parser at no cost. Nothing in the webhooks recurses over the object.
- ``MAX_UID``: 128 characters (the API server sends a 36-character UUID).
- ``MAX_NAME`` 253 and ``MAX_NAMESPACE`` 63: Kubernetes' own name limits;
  mutating webhooks see objects before the API server validates them.
- ``MAX_REFS_TEXT``: 16 KiB of device-refs annotation (32 entries of the
  longest names take ~6 KiB); ``refs.MAX_REFS``: 32 entries.
- ``MAX_VMI_GPUS``: 256 GPUs over all references of one VMI: a guest has 256
  PCI buses and each passed-through GPU sits behind its own root port.
- ``MAX_LIST``: 256 entries in a VMI's ``gpus``, ``hostDevices``,
  ``resourceClaims``, ``resources.requests``/``limits``, and a launcher pod's
  tolerations.
- Scheduling constraints of a VMI, which the dry placement checks against
  every candidate node: ``MAX_TOLERATIONS`` 64, ``MAX_SELECTOR`` 64 labels,
  ``MAX_TERMS`` 16 required node-affinity terms (also on a launcher pod, whose
  terms the pin copies), ``MAX_REQUIREMENTS`` 64 and ``MAX_VALUES`` 256 over
  all terms.
- ``MAX_OWNERS``: 64 ownerReferences on a launcher pod.
- ``MAX_QUOTED``: 64 characters of anything a message quotes, and
  ``MAX_MESSAGE``: 2,048 characters of a whole refusal message.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sized
from typing import Final

from cozygpu.model import refusals
from cozygpu.model.refusals import Refusal

MAX_JSON_ITEMS: Final = 50_000
MAX_JSON_DEPTH: Final = 1024
MAX_UID: Final = 128
MAX_NAME: Final = 253
MAX_NAMESPACE: Final = 63
MAX_REFS_TEXT: Final = 16 * 1024
MAX_VMI_GPUS: Final = 256
MAX_LIST: Final = 256
MAX_TOLERATIONS: Final = 64
MAX_SELECTOR: Final = 64
MAX_TERMS: Final = 16
MAX_REQUIREMENTS: Final = 64
MAX_VALUES: Final = 256
MAX_OWNERS: Final = 64
MAX_QUOTED: Final = 64
MAX_MESSAGE: Final = 2048

#: Bytes the structural count looks at between two yields to the loop (~1.5 ms on a loaded 2-core machine).
SCAN_SLICE: Final = 1024 * 1024
#: Where the API server writes ``request.uid``: first in the request, within the first few hundred bytes.
_UID: Final = re.compile(rb'"request"\s*:\s*\{\s*"uid"\s*:\s*"([^"\\]{1,128})"')
_UID_WINDOW: Final = 4096


def clip(text: str, limit: int = MAX_QUOTED) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was when cut: what a message may quote."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def describe(value: object) -> str:
    """A short, bounded description of a JSON value for a message: never a repr of a whole structure."""
    if isinstance(value, str):
        return repr(clip(value))
    if isinstance(value, bool) or value is None or isinstance(value, int | float):
        return clip(repr(value))
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, Mapping):
        return f"an object of {len(value)} fields"
    return type(value).__name__


def length(value: object) -> int:
    """The length of a JSON list, object or string; 0 for anything else."""
    return len(value) if isinstance(value, Sized) and not isinstance(value, bytes) else 0


def over(subject: str, what: str, value: object, limit: int, unit: str = "entries") -> Refusal | None:
    """A refusal when ``value`` (a list, an object or a string) is longer than ``limit``."""
    found = length(value)
    return refusals.over_limit(subject, what, limit=limit, found=found, unit=unit) if found > limit else None


def name_problem(subject: str, what: str, value: str, limit: int = MAX_NAME) -> Refusal | None:
    """A refusal when a name is longer than Kubernetes allows (checked before it is hashed, matched or shown)."""
    return over(subject, what, value, limit, unit="characters")


async def json_items(body: bytes) -> int:
    """Containers and commas in ``body``, an upper bound of the JSON values it holds; stops past the limit.

    Counted a slice at a time with a yield to the loop between slices, so a
    7 MiB body never holds the loop for its whole scan.
    """
    if len(body) <= MAX_JSON_ITEMS:  # fewer bytes than the limit: fewer items too
        return 0
    found = 0
    for start in range(0, len(body), SCAN_SLICE):
        end = start + SCAN_SLICE
        found += body.count(b"[", start, end) + body.count(b"{", start, end) + body.count(b",", start, end)
        if found > MAX_JSON_ITEMS:
            break
        if end < len(body):
            await asyncio.sleep(0)
    return found


def request_uid(body: bytes) -> str:
    """The ``request.uid`` of a body that will not be parsed, read from where the API server writes it; "" if not there.

    Only refusals are answered with it: a UID that is not the request's makes
    the API server fail the call, which fails closed as well.
    """
    found = _UID.search(body, 0, _UID_WINDOW)
    return found.group(1).decode("utf-8", "replace") if found else ""
