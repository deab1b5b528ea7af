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
- ``usage_plan`` is pure over raw objects; ``apply_usage`` creates, replaces
  (preconditioned on the resourceVersion read) and deletes (idem). A
  Conflict, an AlreadyExists or a vanished object is left to the next pass.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from cozygpu import keys
from cozygpu.base.logging import get_logger
from cozygpu.binder.finalizers import holds
from cozygpu.kube import Client, errors, resource_path

log = get_logger(__name__)

Obj = Mapping[str, Any]

# TODO(keys.py): these names belong with the other shared keys; kept here until keys.py takes them.
COZYSTACK_API_VERSION: Final = "cozystack.io/v1alpha1"
WORKLOAD_MONITOR_LABEL: Final = "workloads.cozystack.io/monitor"
#: The GPU WorkloadMonitor of each tenant namespace.
MONITOR_NAME: Final = "cozygpu-usage"
MANAGED_VALUE: Final = "true"
#: The value of the reserved selector key; no object carries the key, so it matches nothing.
MONITOR_SELECTOR_VALUE: Final = "gpu"
WORKLOAD_PREFIX: Final = "gpudevice-"
_MAX_NAME: Final = 253


def workload_name(device: str) -> str:
    """``gpudevice-<device>``, cut and suffixed with a hash when that exceeds a DNS subdomain."""
    plain = WORKLOAD_PREFIX + device
    if len(plain) <= _MAX_NAME:
        return plain
    digest = hashlib.sha256(device.encode()).hexdigest()[:10]
    return f"{plain[: _MAX_NAME - 11].rstrip('-.')}-{digest}"


def _path(plural: str, namespace: str, name: str | None = None) -> str:
    return resource_path("cozystack.io", "v1alpha1", plural, namespace=namespace, name=name)


def monitor_path(namespace: str, name: str | None = None) -> str:
    return _path("workloadmonitors", namespace, name)


def workload_path(namespace: str, name: str | None = None) -> str:
    return _path("workloads", namespace, name)


def monitor_body(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": COZYSTACK_API_VERSION, "kind": "WorkloadMonitor",
        "metadata": {"name": MONITOR_NAME, "namespace": namespace,
                     "labels": {keys.MANAGED_BY_COZYSTACK_LABEL: MANAGED_VALUE}},
        "spec": {"selector": {keys.USAGE_MONITOR_LABEL: MONITOR_SELECTOR_VALUE}, "kind": "gpu", "type": "gpu"},
    }


def workload_body(device: Obj, resource_names: Mapping[str, str]) -> dict[str, Any]:
    meta, spec = device.get("metadata") or {}, device.get("spec") or {}
    class_name = str(spec.get("className") or "")
    resource = resource_names.get(class_name) or keys.class_quota_key(class_name)
    return {
        "apiVersion": COZYSTACK_API_VERSION, "kind": "Workload",
        "metadata": {
            "name": workload_name(str(meta.get("name"))), "namespace": meta.get("namespace"),
            "labels": {WORKLOAD_MONITOR_LABEL: MONITOR_NAME, keys.MANAGED_BY_COZYSTACK_LABEL: MANAGED_VALUE},
            "ownerReferences": [{"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                                 "name": meta.get("name"), "uid": meta.get("uid"),
                                 "controller": False, "blockOwnerDeletion": False}],
        },
        "status": {"kind": keys.GPUDEVICE_KIND, "type": class_name, "resources": {resource: str(spec.get("count"))},
                   "operational": (device.get("status") or {}).get("phase") == "Bound"},
    }


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


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _current(wanted: Obj, have: Obj | None) -> bool:
    """``have`` already says what ``wanted`` says (its labels include ours; same spec, status, owners)."""
    if have is None:
        return False
    want_meta, have_meta = wanted["metadata"], have.get("metadata") or {}
    labels = have_meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in want_meta["labels"].items()):
        return False
    if [dict(o) for o in have_meta.get("ownerReferences") or ()] != list(want_meta.get("ownerReferences") or ()):
        return False
    return all(_plain(have.get(part)) == _plain(wanted.get(part)) for part in ("spec", "status") if part in wanted)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _with_version(wanted: Obj, have: Obj | None) -> Obj:
    if have is None:
        return wanted
    version = (have.get("metadata") or {}).get("resourceVersion")
    return {**wanted, "metadata": {**wanted["metadata"], "resourceVersion": version}}


def _removal(obj: Obj, path: str) -> Removal:
    return Removal(path=path, resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""))


def usage_plan(devices: Iterable[Obj], classes: Iterable[Obj], monitors: Iterable[Obj],
               workloads: Iterable[Obj]) -> UsagePlan:
    """What to write so the records match the holds; ``monitors``/``workloads`` may hold others' objects."""
    resource_names = {str((c.get("metadata") or {}).get("name")): str((c.get("spec") or {}).get("resourceName"))
                      for c in classes}
    wanted = {}
    for device in devices:
        if holds(device):
            body = workload_body(device, resource_names)
            wanted[_key(body)] = body
    namespaces = sorted({namespace for namespace, _ in wanted})
    ours_m = {_key(m): m for m in monitors if _key(m)[1] == MONITOR_NAME}
    ours_w = {_key(w): w for w in workloads
              if ((w.get("metadata") or {}).get("labels") or {}).get(WORKLOAD_MONITOR_LABEL) == MONITOR_NAME}
    put_monitors = []
    for namespace in namespaces:
        body, have = monitor_body(namespace), ours_m.get((namespace, MONITOR_NAME))
        if not _current(body, have):
            put_monitors.append(_with_version(body, have))
    put_workloads = [_with_version(body, ours_w.get(key)) for key, body in sorted(wanted.items())
                     if not _current(body, ours_w.get(key))]
    remove_workloads = [_removal(w, workload_path(*key)) for key, w in sorted(ours_w.items()) if key not in wanted]
    remove_monitors = [_removal(m, monitor_path(*key)) for key, m in sorted(ours_m.items())
                       if key[0] not in namespaces]
    return UsagePlan(put_monitors=tuple(put_monitors), put_workloads=tuple(put_workloads),
                     remove_workloads=tuple(remove_workloads), remove_monitors=tuple(remove_monitors))


@attrs.frozen(kw_only=True)
class UsageReport:
    written: int = 0
    stale: int = 0
    #: (kind, resourceVersion) of each create or replace the server answered: for read-your-writes.
    versions: tuple[tuple[str, str], ...] = ()

    @property
    def requeue(self) -> bool:
        return self.stale > 0


async def _put(client: Client, body: Obj, path_of: Callable[..., str]) -> Obj:
    namespace, name = _key(body)
    if body["metadata"].get("resourceVersion"):
        answer = await client.replace(path_of(namespace, name), dict(body))
    else:
        answer = await client.create(path_of(namespace), dict(body))
    log.info("usage record written", object=f"{namespace}/{name}", kind=body.get("kind"))
    return answer


async def _remove(client: Client, removal: Removal) -> Obj | None:
    await client.delete(removal.path, resource_version=removal.resource_version or None)
    log.info("usage record removed", object=removal.path)
    return None


async def apply_usage(client: Client, plan: UsagePlan) -> UsageReport:
    """Write ``plan`` in its order; a stale step is counted and the rest still run."""
    steps: list[Callable[[], Awaitable[Obj | None]]] = [
        *(functools.partial(_put, client, body, monitor_path) for body in plan.put_monitors),
        *(functools.partial(_put, client, body, workload_path) for body in plan.put_workloads),
        *(functools.partial(_remove, client, r) for r in (*plan.remove_workloads, *plan.remove_monitors)),
    ]
    written = stale = 0
    versions: list[tuple[str, str]] = []
    for step in steps:
        try:
            answer = await step()
            written += 1
        except (errors.Conflict, errors.AlreadyExists, errors.NotFound) as error:
            log.info("usage record change stale, requeued", error=str(error))
            stale += 1
            continue
        except errors.Forbidden as error:
            if not _namespace_terminating(error):
                raise
            # Its namespace is being deleted, and the records with it: nothing to keep, nothing to retry.
            log.info("usage record skipped: its namespace is being deleted", error=str(error))
            continue
        if answer is not None:
            versions.append((str(answer.get("kind") or ""),
                             str((answer.get("metadata") or {}).get("resourceVersion") or "")))
    return UsageReport(written=written, stale=stale, versions=tuple(versions))


def _namespace_terminating(error: errors.Forbidden) -> bool:
    """The API server's refusal to create in a namespace being deleted (its NamespaceLifecycle admission)."""
    causes = {str(c.get("type") or c.get("reason") or "") for c in error.causes}
    return "NamespaceTerminating" in causes or "because it is being terminated" in error.message
