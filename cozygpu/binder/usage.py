"""Usage records (R-BIND-9): a Workload per held device under one WorkloadMonitor per namespace.

Why: Cozystack's usage accounting reads Workload objects (``status.kind``,
``type``, ``resources``, ``operational``); a held GPU must show there even
while its VM is off. Cozystack deletes a Workload that lacks the
``workloads.cozystack.io/monitor`` label or whose monitor is gone, so each
namespace holding devices gets one monitor, whose selector is the reserved
usage-monitor key: no object may carry that key, so the monitor matches
nothing and tenant labels cannot shape these records.

Contract:
- A device *holds* (Bound or Lost, what its budgets count) -> one Workload
  ``gpudevice-<device>`` in its namespace: ``resources`` is the class's
  resource name (the key a launcher pod's GPUs are accounted under) with the
  device's count, ``operational`` is whether it is Bound. It is removed when
  the device no longer holds or is gone; the device finalizer keeps a
  deleting device, and so its record, while a VMI uses it. An owner
  reference to the device lets the garbage collector remove a record the
  binder missed.
- Every record and monitor carries ``internal.cozystack.io/managed-by-cozystack``
  (so the lineage webhook leaves them alone) and no usage-monitor key.
- The monitor is created before the first record of its namespace and
  deleted after the last one.
- The records' JSON is built and compared in ``cozygpu.api.workloads``;
  ``usage_plan`` is pure over raw objects; ``usage_writes`` turns it into
  the patcher's creates, replaces (preconditioned on the resourceVersion
  read) and deletes (idem). A Conflict, an AlreadyExists or a vanished
  object requeues the work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from cozygpu.api import classes as class_json
from cozygpu.api import meta
from cozygpu.api.devices import holds
from cozygpu.api.workloads import MONITOR_NAME, monitor_body, monitor_of, says, with_version, workload_body
from cozygpu.binder.patcher import Verb, Write
from cozygpu.cache.kinds import KindSpec
from cozygpu.kube import resource_path

Obj = Mapping[str, Any]

#: Cozystack's usage kinds (``../shared/reference/cozystack.md`` §3); cached once served.
WORKLOAD_MONITORS: Final = KindSpec("cozystack.io", "v1alpha1", "workloadmonitors", "WorkloadMonitor", True)
WORKLOADS: Final = KindSpec("cozystack.io", "v1alpha1", "workloads", "Workload", True)


def _path(plural: str, namespace: str, name: str | None = None) -> str:
    return resource_path("cozystack.io", "v1alpha1", plural, namespace=namespace, name=name)


def monitor_path(namespace: str, name: str | None = None) -> str:
    return _path("workloadmonitors", namespace, name)


def workload_path(namespace: str, name: str | None = None) -> str:
    return _path("workloads", namespace, name)


@attrs.frozen(kw_only=True)
class Removal:
    path: str
    resource_version: str


@attrs.frozen(kw_only=True)
class UsagePlan:
    """In order: monitors to put, records to put, records to remove, monitors to remove."""

    put_monitors: tuple[Obj, ...] = ()
    put_workloads: tuple[Obj, ...] = ()
    remove_workloads: tuple[Removal, ...] = ()
    remove_monitors: tuple[Removal, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.put_monitors or self.put_workloads or self.remove_workloads or self.remove_monitors)


def _removal(obj: Obj, path: str) -> Removal:
    return Removal(path=path, resource_version=meta.resource_version(obj))


def usage_plan(devices: Iterable[Obj], classes: Iterable[Obj], monitors: Iterable[Obj],
               workloads: Iterable[Obj]) -> UsagePlan:
    """What to write so the records match the holds; ``monitors``/``workloads`` may hold others' objects."""
    resource_names = {meta.name(c): class_json.resource_name(c) for c in classes}
    wanted = {}
    for device in devices:
        if holds(device):
            body = workload_body(device, resource_names)
            wanted[meta.key(body)] = body
    namespaces = sorted({namespace for namespace, _ in wanted})
    ours_m = {meta.key(m): m for m in monitors if meta.key(m)[1] == MONITOR_NAME}
    ours_w = {meta.key(w): w for w in workloads if monitor_of(w) == MONITOR_NAME}
    put_monitors = []
    for namespace in namespaces:
        body, have = monitor_body(namespace), ours_m.get((namespace, MONITOR_NAME))
        if not says(have, body):
            put_monitors.append(with_version(body, have))
    put_workloads = [with_version(body, ours_w.get(key)) for key, body in sorted(wanted.items())
                     if not says(ours_w.get(key), body)]
    remove_workloads = [_removal(w, workload_path(*key)) for key, w in sorted(ours_w.items()) if key not in wanted]
    remove_monitors = [_removal(m, monitor_path(*key)) for key, m in sorted(ours_m.items())
                       if key[0] not in namespaces]
    return UsagePlan(put_monitors=tuple(put_monitors), put_workloads=tuple(put_workloads),
                     remove_workloads=tuple(remove_workloads), remove_monitors=tuple(remove_monitors))


def usage_writes(plan: UsagePlan) -> list[Write]:
    """``plan`` as the patcher's writes, in its order: monitors, then Workloads put (replaced on the
    version seen, or created), then the records no device wants removed, each on its version."""
    def put(spec: KindSpec, body: Obj, path_of: Callable[..., str]) -> Write:
        namespace, name = meta.key(body)
        version = meta.resource_version(body)
        if version:
            return Write(kind=spec, path=path_of(namespace, name), verb=Verb.PUT, body=body, resource_version=version,
                         what=f"{spec.kind} {namespace}/{name}")
        return Write(kind=spec, path=path_of(namespace), verb=Verb.CREATE, body=body,
                     what=f"{spec.kind} {namespace}/{name}")

    return [*(put(WORKLOAD_MONITORS, body, monitor_path) for body in plan.put_monitors),
            *(put(WORKLOADS, body, workload_path) for body in plan.put_workloads),
            *(Write(kind=WORKLOADS, path=r.path, verb=Verb.DELETE, resource_version=r.resource_version or None,
                    what=r.path) for r in plan.remove_workloads),
            *(Write(kind=WORKLOAD_MONITORS, path=r.path, verb=Verb.DELETE, resource_version=r.resource_version or None,
                    what=r.path) for r in plan.remove_monitors)]
