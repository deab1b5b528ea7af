"""Write the agent's fields into its own node's GPUNode (R-AGENT, SPEC §1.3).

The binder writes ``status.conditions`` into the same status, so the agent
never sends the whole status: it merge-patches the status subresource with
only ``devices``, ``resourceNames`` and ``agent``. In a JSON merge patch a
list is replaced whole and a key that is absent is left alone, so the
binder's conditions survive every write, and a lost kubelet can be reported by
patching ``agent`` alone, which keeps the last devices and their report time.

The GPUNode is created (empty; status cannot be set on create) the first time
a patch finds it missing. The writer only ever names its own node; the agent
policy (R-POL-2) holds every agent to that on the server side.

RBAC it needs: ``gpunodes`` create (never a read: a patch of a missing object answers 404), ``gpunodes/status`` patch.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from cozygpu import keys
from cozygpu.kube import Client, Obj, resource_path
from cozygpu.kube import errors as kube_errors


class StatusWriter(Protocol):
    async def write(self, status: dict[str, Any]) -> Obj: ...


class GPUNodeWriter:
    """Merge-patches ``status`` of the GPUNode named after this node, creating it when missing."""

    def __init__(self, client: Client, node_name: str, *, timeout: float = 15.0) -> None:
        self._client = client
        self.node_name = node_name
        self._timeout = timeout

    def _path(self, subresource: str | None = None) -> str:
        return resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL, name=self.node_name,
                             subresource=subresource)

    async def write(self, status: dict[str, Any]) -> Obj:
        """Patch the given status fields; the answer is the whole GPUNode as stored."""
        try:
            return await self._patch(status)
        except kube_errors.NotFound:
            await self._create()
            return await self._patch(status)

    async def _patch(self, status: dict[str, Any]) -> Obj:
        return await self._client.merge_patch(self._path("status"), {"status": status}, timeout=self._timeout)

    async def _create(self) -> None:
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.GPUNODE_KIND,
            "metadata": {"name": self.node_name},
        }
        # AlreadyExists: created between our patch and create (a restarted agent racing its predecessor).
        with contextlib.suppress(kube_errors.AlreadyExists):
            await self._client.create(
                resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL), body, timeout=self._timeout)
