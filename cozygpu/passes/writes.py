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
    """The latest resourceVersion written per kind key (see the module docstring).

    A write may be recorded as *assumed*: its writer reads it back through its own overlay until the
    cache shows it (the binder's placement writes), so the next placement cycle need not wait for it;
    every other pass still does. ``items(assumed=False)`` leaves such writes out.
    """

    def __init__(self) -> None:
        self._versions: dict[str, str] = {}
        #: The latest write per kind that is not assumed: what every pass waits for.
        self._firm: dict[str, str] = {}

    def record(self, kind: SpecOrKey, resource_version: str, *, assumed: bool = False) -> None:
        """A write to ``kind`` the server answered with ``resource_version`` ("" is ignored)."""
        if not resource_version:
            return
        key = _key(kind)
        _keep_latest(self._versions, key, resource_version)
        if not assumed:
            _keep_latest(self._firm, key, resource_version)

    def record_object(self, kind: SpecOrKey, answer: Mapping[str, Any]) -> None:
        """A write whose answer is the object the server stored."""
        version = (answer.get("metadata") or {}).get("resourceVersion")
        if isinstance(version, str):
            self.record(kind, version)

    def merge(self, other: Writes) -> None:
        for key, version in other._versions.items():
            _keep_latest(self._versions, key, version)
        for key, version in other._firm.items():
            _keep_latest(self._firm, key, version)

    def discard(self, kind: SpecOrKey) -> None:
        self._versions.pop(_key(kind), None)
        self._firm.pop(_key(kind), None)

    def seen(self, kind: SpecOrKey, resource_version: str) -> None:
        """The cache has seen ``kind`` up to ``resource_version``: the writes up to it are forgotten."""
        key = _key(kind)
        for versions in (self._versions, self._firm):
            have = versions.get(key)
            if have is not None and resource_version_at_least(resource_version, have):
                del versions[key]

    def items(self, *, assumed: bool = True) -> Iterator[tuple[str, str]]:
        """Each kind's latest write (``assumed=False``: its latest write that is not assumed)."""
        return iter(list((self._versions if assumed else self._firm).items()))

    def pending(self, *, assumed: bool = True) -> bool:
        return bool(self._versions if assumed else self._firm)

    def __bool__(self) -> bool:
        return bool(self._versions)

    def __len__(self) -> int:
        return len(self._versions)

    def __repr__(self) -> str:
        return f"Writes({self._versions!r})"

    def as_dict(self) -> dict[str, str]:
        return dict(self._versions)


def _keep_latest(versions: dict[str, str], key: str, resource_version: str) -> None:
    have = versions.get(key)
    if have is None or not resource_version_at_least(have, resource_version):
        versions[key] = resource_version
