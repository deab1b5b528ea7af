"""The effective GPU resource names (R-MOD-9), kept as counts of what declares each one.

Contract: a name is effective while anything declares it: the hoster's list, a class's resourceName, a
node's report, KubeVirt's table (``cozygpu.model.resource_names`` says which entries count). ``declare``
adds (+1) or takes away (-1) one source's names; ``settle`` makes the set again and says which names
came or went, so what reads them (pods' raw use, tenants' raw budgets) is derived again for those names
only.
"""

from __future__ import annotations

from collections.abc import Iterable

from cozygpu import keys


class NameSources:
    """How many sources declare each effective name, and the set as of the last ``settle``."""

    def __init__(self, hoster: Iterable[str] = ()) -> None:
        self._count: dict[str, int] = {}
        self.names: frozenset[str] = frozenset()
        #: Names whose count went to or from zero since the last ``settle``.
        self._moved: set[str] = set()
        self.declare(hoster, +1)

    def declare(self, names: Iterable[str], sign: int) -> None:
        """One source's names added (+1) or taken away (-1); each name of a source counts once."""
        for name in set(names):
            if not name or name.startswith(keys.QUOTA_PREFIX):
                continue  # our own domain's names are budget keys, never resource names
            count = self._count.get(name, 0) + sign
            if count > 0:
                self._count[name] = count
            elif count == 0:
                del self._count[name]
            else:
                raise ValueError(f"resource name {name}: taken away more often than declared")
            if count in (0, 1):
                self._moved.add(name)

    def settle(self) -> frozenset[str]:
        """The names that came or went since the last call (``names`` is the set from now on)."""
        moved = frozenset(name for name in self._moved if (name in self._count) != (name in self.names))
        self._moved.clear()
        if moved:
            self.names = frozenset(self._count)
        return moved
