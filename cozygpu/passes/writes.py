"""``Writes``: what a pass wrote, per kind, so the driver can wait for the cache to see it (R-BIND-2).

A pass's ``apply`` records every write the server accepted, as it goes: the
kind (a ``KindSpec`` or its cache key) and the resourceVersion the server
answered with. Per kind only the latest counts: an informer that has seen a
kind's resourceVersion R has seen every write to that kind up to R. A write
that failed half way through ``apply`` has still recorded what went before.

Record only kinds the cache holds, and a resourceVersion the kind's watch
will deliver (an object inside the informer's selector): anything else is
seen only through a bookmark, about once a minute.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from cozygpu.cache.informer import resource_version_at_least
from cozygpu.cache.kinds import KindSpec, SpecOrKey


def _key(kind: SpecOrKey) -> str:
    return kind.key if isinstance(kind, KindSpec) else kind


class Writes:
    """The latest resourceVersion written per kind key (see the module docstring)."""

    def __init__(self) -> None:
        self._versions: dict[str, str] = {}

    def record(self, kind: SpecOrKey, resource_version: str) -> None:
        """A write to ``kind`` the server answered with ``resource_version`` ("" is ignored)."""
        if not resource_version:
            return
        key = _key(kind)
        have = self._versions.get(key)
        if have is None or not resource_version_at_least(have, resource_version):
            self._versions[key] = resource_version

    def record_object(self, kind: SpecOrKey, answer: Mapping[str, Any]) -> None:
        """A write whose answer is the object the server stored."""
        version = (answer.get("metadata") or {}).get("resourceVersion")
        if isinstance(version, str):
            self.record(kind, version)

    def merge(self, other: Writes) -> None:
        for key, version in other.items():
            self.record(key, version)

    def discard(self, kind: SpecOrKey) -> None:
        self._versions.pop(_key(kind), None)

    def items(self) -> Iterator[tuple[str, str]]:
        return iter(list(self._versions.items()))

    def __bool__(self) -> bool:
        return bool(self._versions)

    def __len__(self) -> int:
        return len(self._versions)

    def __repr__(self) -> str:
        return f"Writes({self._versions!r})"

    def as_dict(self) -> dict[str, str]:
        return dict(self._versions)
