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
- ``usage_plan`` is pure over raw objects; ``usage_writes`` turns it into
  the patcher's creates, replaces (preconditioned on the resourceVersion
  read) and deletes (idem). A Conflict, an AlreadyExists or a vanished
  object requeues the work.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from cozygpu import keys
from cozygpu.binder.finalizers import holds
from cozygpu.binder.patcher import Verb, Write
from cozygpu.cache.kinds import KindSpec
from cozygpu.kube import resource_path

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

#: Cozystack's usage kinds (``../shared/reference/cozystack.md`` §3); cached once served.
WORKLOAD_MONITORS: Final = KindSpec("cozystack.io", "v1alpha1", "workloadmonitors", "WorkloadMonitor", True)
WORKLOADS: Final = KindSpec("cozystack.io", "v1alpha1", "workloads", "Workload", True)


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


def usage_writes(plan: UsagePlan) -> list[Write]:
    """``plan`` as the patcher's writes, in its order: monitors, then Workloads put (replaced on the
    version seen, or created), then the records no device wants removed, each on its version."""
    def put(spec: KindSpec, body: Obj, path_of: Callable[..., str]) -> Write:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        version = str(meta.get("resourceVersion") or "")
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
