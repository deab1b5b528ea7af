"""Cozystack's usage records as cozygpu writes them (R-BIND-9): a Workload per held GPUDevice, under one
WorkloadMonitor per namespace; built and compared here, pure.

Cozystack's usage accounting reads Workload objects (``status.kind``,
``type``, ``resources``, ``operational``) and deletes a Workload that lacks
the ``workloads.cozystack.io/monitor`` label or whose monitor is gone. The
monitor's selector is the reserved usage-monitor key, which no object may
carry: it matches nothing, so tenant labels cannot shape these records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from cozygpu import keys
from cozygpu.api import devices
from cozygpu.api.meta import (
    Obj,
    labels,
    metadata,
    name,
    namespace,
    owner_references,
    resource_version,
    section,
    uid,
)

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
#: The parts of a record compared with what is stored (where the record has them).
_PARTS: Final = ("spec", "status")


def workload_name(device: str) -> str:
    """``gpudevice-<device>``, cut and suffixed with a hash when that exceeds a DNS subdomain."""
    plain = WORKLOAD_PREFIX + device
    if len(plain) <= _MAX_NAME:
        return plain
    digest = hashlib.sha256(device.encode()).hexdigest()[:10]
    return f"{plain[: _MAX_NAME - 11].rstrip('-.')}-{digest}"


def monitor_body(namespace: str) -> dict[str, Any]:
    """The GPU WorkloadMonitor of ``namespace``."""
    return {
        "apiVersion": COZYSTACK_API_VERSION, "kind": "WorkloadMonitor",
        "metadata": {"name": MONITOR_NAME, "namespace": namespace,
                     "labels": {keys.MANAGED_BY_COZYSTACK_LABEL: MANAGED_VALUE}},
        "spec": {"selector": {keys.USAGE_MONITOR_LABEL: MONITOR_SELECTOR_VALUE}, "kind": "gpu", "type": "gpu"},
    }


def workload_body(device: Obj, resource_names: Mapping[str, str]) -> dict[str, Any]:
    """The usage record of a held ``device``: its class's resource name (``resource_names``: class -> name;
    the class's quota key when it has none) with the device's count, operational while it is Bound."""
    device_name, class_name = name(device), devices.class_name(device)
    resource = resource_names.get(class_name) or keys.class_quota_key(class_name)
    return {
        "apiVersion": COZYSTACK_API_VERSION, "kind": "Workload",
        "metadata": {
            "name": workload_name(device_name), "namespace": namespace(device),
            "labels": {WORKLOAD_MONITOR_LABEL: MONITOR_NAME, keys.MANAGED_BY_COZYSTACK_LABEL: MANAGED_VALUE},
            "ownerReferences": [{"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                                 "name": device_name, "uid": uid(device),
                                 "controller": False, "blockOwnerDeletion": False}],
        },
        "status": {"kind": keys.GPUDEVICE_KIND, "type": class_name,
                   "resources": {resource: str(devices.count(device))}, "operational": devices.bound(device)},
    }


def monitor_of(workload: Obj) -> str:
    """The monitor a Workload is recorded under ("" for none)."""
    return labels(workload).get(WORKLOAD_MONITOR_LABEL, "")


def says(have: Obj | None, wanted: Obj) -> bool:
    """``have`` (stored) already says what ``wanted`` says: its labels include ours, the same owners, and the
    same spec and status wherever ``wanted`` has them."""
    if have is None:
        return False
    have_labels = labels(have)
    if any(have_labels.get(k) != v for k, v in labels(wanted).items()):
        return False
    if [dict(o) for o in owner_references(have)] != [dict(o) for o in owner_references(wanted)]:
        return False
    return all(_plain(section(have, part)) == _plain(section(wanted, part)) for part in _PARTS if part in wanted)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def with_version(wanted: Obj, have: Obj | None) -> Obj:
    """``wanted`` carrying ``have``'s resourceVersion (a replace on the version read), or as it is."""
    if have is None:
        return wanted
    return {**wanted, "metadata": {**metadata(wanted), "resourceVersion": resource_version(have)}}
