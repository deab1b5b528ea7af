"""The shared model: every GPU decision as a pure function of a typed snapshot (SPEC section 2).

No I/O, no asyncio, no clock reads: time is passed in. Callers (the binder,
the webhooks, the catalog option source, the CLI) build a
:class:`~cozygpu.model.snapshot.Snapshot` from their own cache and ask the
same functions, so their answers cannot disagree. An import-linter contract
in ``pyproject.toml`` keeps this package free of anything with I/O.

Modules, one responsibility each:

- ``snapshot``: the frozen views and the Snapshot with its indexes;
  ``derive``: builds a Snapshot from views and keeps it up to date.
- ``tenants`` (R-MOD-1), ``quantities``, ``budgets`` (R-MOD-2, R-MOD-3),
  ``pods`` (R-MOD-4 arithmetic), ``launchers`` (R-MOD-5), ``coverage``
  (R-MOD-6), ``capacity`` (R-MOD-7), ``eligibility`` (R-MOD-8),
  ``resource_names`` (R-MOD-9), ``naming`` (R-MOD-10), ``classes``
  (R-MOD-11), ``catalog`` (R-MOD-12), ``placement`` (R-BIND-4..6).
- ``refusals``: the one value every refusal is.
"""
