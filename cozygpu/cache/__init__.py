"""The informer cache: every object the process reads, kept in step with the API server.

Stages, one file each::

    kube.Client ─▶ reflector.py ─▶ informer.py ─▶ store.py ─▶ readers
    (list/watch)   list, watch,    serve cycles,   objects by key,
                   relist, backoff  fan-out,        named indexes
                                    rv waits          │
                                      └─▶ handlers, triggers.py (coalescing wake-ups)
    cache.py: the lazy map of informers, started when kinds.py says a kind is served

Contract for every reader:
- **Do not mutate what you get.** Objects are raw JSON dicts, deeply frozen
  (``frozen.py``): shared by every reader, refusing writes with ``TypeError``.
  ``thaw(obj)`` (or ``copy.deepcopy``) gives a mutable copy.
- **Eventually consistent, never incomplete.** A store lags the API server by
  the watch latency. A kind that is not served raises ``KindNotServed``; one not
  listed yet raises ``NotSynced``: never an empty answer in their place.
- **Prove freshness when it matters** (R-BIND-2): after a write, ``await
  cache.wait_for_resource_version(spec, written_rv)`` returns the store once it
  has seen that write.
- Handlers and triggers run on the cache's loop, in store order, after the
  store changed. Handlers must not block.

Public API::

    KindSpec(group, version, plural, kind, namespaced, *, namespace=None,
             field_selector=None, label_selector=None, transform=None,
             indexers={name: fn(obj) -> Iterable[str]}, needs_crd=<not a built-in group>, name=None)
        .key -> str                       # how the informer is named everywhere

    Cache(client, *, registry=None, clock=None, settings=None)
        .add(spec) -> Informer            # lazy: starts when running and served
        async .run()                      # inside the process's TaskGroup; cancel to stop
        async with .running(): ...        # the same, for a block
        .store(spec_or_key) -> Store      # KindNotServed | NotSynced | UnknownKind
        .is_served(spec_or_key) -> bool
        .has_synced(*specs) -> bool       # readiness (R-RUN-2)
        async .wait_synced(*specs, timeout=None)
        async .wait_for_resource_version(spec_or_key, rv, timeout=None) -> Store
        .trigger(*specs, name="") -> Trigger
        .informer(spec_or_key) -> Informer

    Store
        .get(namespace | None, name) -> FrozenDict | None
        .list(namespace=None) -> list[FrozenDict]
        .by_index(index, value) -> list[FrozenDict]
        .index_values(index) -> list[str]
        .resource_version -> str          # last seen: list, event or bookmark

    Informer
        .store, .served (True | False | None), .has_synced, .resource_version
        .subscribe(handler: fn(Event) -> None) -> unsubscribe
        .add_trigger(trigger) / .remove_trigger(trigger)
        async .wait_synced(timeout=None)
        async .wait_for_resource_version(rv, timeout=None) -> Store

    Trigger: .fire(reason=""), async .wait() -> frozenset[str], .poll()

The specs of the kinds cozygpu reads (transforms, indexes such as devices
by node and by attached VMI) are the read model's, in ``cozygpu.views.specs``;
``metrics.py`` holds the Prometheus collectors (pass a ``CollectorRegistry`` or use the default one).
"""

from cozygpu.cache.cache import Cache
from cozygpu.cache.errors import CacheError, KindNotServed, NotSynced, UnknownKind
from cozygpu.cache.frozen import FrozenDict, FrozenList, freeze, thaw
from cozygpu.cache.informer import Informer
from cozygpu.cache.kinds import CRDS, KindSpec, SpecOrKey
from cozygpu.cache.metrics import CacheMetrics, default_metrics
from cozygpu.cache.reflector import ReflectorSettings
from cozygpu.cache.store import LABELS, NAMESPACE, Event, Store, index_field, index_labels
from cozygpu.cache.triggers import Trigger

__all__ = [
    "CRDS",
    "LABELS",
    "NAMESPACE",
    "Cache",
    "CacheError",
    "CacheMetrics",
    "Event",
    "FrozenDict",
    "FrozenList",
    "Informer",
    "KindNotServed",
    "KindSpec",
    "NotSynced",
    "ReflectorSettings",
    "SpecOrKey",
    "Store",
    "Trigger",
    "UnknownKind",
    "default_metrics",
    "freeze",
    "index_field",
    "index_labels",
    "thaw",
]
