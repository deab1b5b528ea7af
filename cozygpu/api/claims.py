"""The ResourceClaim that holds a DRA-sourced GPUDevice's devices (SPEC §1.5), built here, pure.

A hold is a claim in the device's namespace, named after the GPUDevice and
owned by it (a controller reference: the garbage collector deletes it with the
device). Its spec asks for the set as kube-scheduler's allocator would see it:
one request per GPU, ``gpu-0`` … ``gpu-<count-1>``, each of exactly one device
of the offer's DeviceClass with the offer's selectors, and the offer's
``matchAttribute`` as a constraint over all of them. One device per request
because KubeVirt's launcher takes exactly one device per ``gpus`` entry
(``claimName``/``requestName``; VEP 10: "count > 1 not supported"), so each
GPU of the VM names its own request. Its status is
written by the binder, not the scheduler: an allocation naming the very
devices placed, the node's ``matchFields metadata.name`` selector, an
``allocationTimestamp`` (without one the scheduler's later reservation for a
launcher is refused as a change to an immutable allocation), and
``reservedFor`` the GPUDevice itself, so the resourceclaim controller leaves
the allocation alone while no pod uses it. Shapes verified against
Kubernetes 1.36 in ``tests/devcluster/test_dra_plane.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from cozygpu import keys
from cozygpu.api.times import rfc3339
from cozygpu.model.dra import DeviceRef

API_GROUP: Final = "resource.k8s.io"
API_VERSION: Final = "v1"
#: The requests of a hold are named ``gpu-<i>``, one per GPU (``request_name``).
REQUEST_PREFIX: Final = "gpu-"


def request_name(index: int) -> str:
    """The request of a hold's ``index``-th GPU (0-based): a launcher's ``gpus[].requestName``."""
    return f"{REQUEST_PREFIX}{index}"


def consumer(device_name: str, device_uid: str) -> dict[str, str]:
    """The GPUDevice as a claim's consumer (``status.reservedFor`` entry)."""
    return {"apiGroup": keys.GROUP, "resource": keys.GPUDEVICE_PLURAL, "name": device_name, "uid": device_uid}


def hold_claim(device_name: str, device_uid: str, *, device_class: str, count: int,
               selectors: Sequence[str] = (), match_attribute: str = "") -> dict[str, Any]:
    """The claim a GPUDevice's hold is (its ``metadata.namespace`` comes from the path it is created at)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": expression}} for expression in selectors]
    names = [request_name(i) for i in range(count)]
    devices: dict[str, Any] = {"requests": [{"name": name, "exactly": dict(exactly)} for name in names]}
    if match_attribute:
        devices["constraints"] = [{"requests": names, "matchAttribute": match_attribute}]
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "ResourceClaim",
        "metadata": {"name": device_name,
                     "ownerReferences": [{"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND,
                                          "name": device_name, "uid": device_uid, "controller": True,
                                          "blockOwnerDeletion": True}]},
        "spec": {"devices": devices},
    }


def hold_status(node: str, devices: Sequence[DeviceRef], *, device_name: str, device_uid: str,
                now: datetime) -> dict[str, Any]:
    """The claim's status that holds ``devices`` of ``node`` for the GPUDevice (merge-patched on the
    ``status`` subresource with the claim's resourceVersion); the ``i``-th device answers request ``gpu-<i>``."""
    return {
        "allocation": {
            "devices": {"results": [{"request": request_name(i), "driver": ref.driver, "pool": ref.pool,
                                     "device": ref.device} for i, ref in enumerate(devices)]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
            "allocationTimestamp": rfc3339(now),
        },
        "reservedFor": [consumer(device_name, device_uid)],
    }
