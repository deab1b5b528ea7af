"""Helpers of the binder's API tests: orders, classes and paths, made through the admin client."""

from __future__ import annotations

import uuid
from typing import Any

from cozygpu import keys
from cozygpu.kube import Client, resource_path

DEVICES = (keys.GROUP, keys.VERSION, keys.GPUDEVICE_PLURAL)
CLASSES = (keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL)
VMIS = ("kubevirt.io", "v1", "virtualmachineinstances")
VMI_CRD = "virtualmachineinstances.kubevirt.io"


def device_path(namespace: str | None, name: str | None = None, *, status: bool = False) -> str:
    return resource_path(*DEVICES, namespace=namespace, name=name, subresource="status" if status else None)


def class_path(name: str | None = None) -> str:
    return resource_path(*CLASSES, name=name)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def order(admin: Client, namespace: str, name: str, *, count: int = 1, class_name: str = "h100",
                status: dict[str, Any] | None = None) -> dict[str, Any]:
    """A GPUDevice, with ``status`` written through the status subresource when given."""
    body = {"apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": name},
            "spec": {"className": class_name, "count": count}}
    made = await admin.create(device_path(namespace), body)
    if status:
        made = await admin.merge_patch(device_path(namespace, name, status=True), {"status": status})
    return made


async def offer(admin: Client, name: str, *, resource_name: str = "nvidia.com/GH100_H100_SXM5_80GB") -> dict[str, Any]:
    body = {"apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND, "metadata": {"name": name},
            "spec": {"vendor": "NVIDIA", "model": "H100", "mode": "Passthrough", "memory": "80Gi",
                     "resourceName": resource_name, "source": {"devicePlugin": {}}}}
    return await admin.create(class_path(), body)


async def items(admin: Client, path: str) -> list[dict[str, Any]]:
    listed = await admin.list_objects(path)
    return list(listed["items"])


async def read_all(admin: Client, namespace: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in await items(admin, device_path(namespace))}
