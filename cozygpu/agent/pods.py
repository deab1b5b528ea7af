"""Look up the pods kubelet lists with GPU devices: are they still holding them?

pod-resources ``List`` names pods by namespace and name only, with no UID and
no phase, and kubelet 1.32/1.33 still list pods in a final phase with devices
a new pod may already hold (kubelet/sysfs reference §3). So each such pod is
read through the API (``get`` on pods, nothing wider) and judged:

- not found: a leftover in kubelet's list, holds nothing;
- ``spec.nodeName`` names another node: the name was reused by a new pod
  elsewhere and kubelet lists the old incarnation, holds nothing here;
- phase ``Succeeded`` or ``Failed``: holds nothing;
- otherwise it holds its devices, and its UID is recorded with the verdict;
- a failed lookup is ``UNKNOWN``: the devices count as held (never free) and
  the failure is reported.

Only pods holding a device that lands on a GPU function are looked up, so the
reads per report stay at the handful of VM launchers on a node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

from cozygpu.agent.inventory import PodKey, PodState, PodVerdict
from cozygpu.kube import Client, resource_path
from cozygpu.kube import errors as kube_errors

FINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


class ApiPodLookup:
    """Judges listed pods by reading them through the API, a few at a time."""

    def __init__(self, client: Client, node_name: str, *, concurrency: int = 4, timeout: float = 10.0) -> None:
        self._client = client
        self._node = node_name
        self._limit = asyncio.Semaphore(concurrency)
        self._timeout = timeout

    async def __call__(self, keys: Sequence[PodKey]) -> dict[PodKey, PodState]:
        async with asyncio.TaskGroup() as group:
            tasks = {key: group.create_task(self._one(*key)) for key in keys}
        return {key: task.result() for key, task in tasks.items()}

    async def _one(self, namespace: str, name: str) -> PodState:
        path = resource_path("", "v1", "pods", namespace=namespace, name=name)
        async with self._limit:
            try:
                pod = await self._client.get_or_none(path, timeout=self._timeout, attempts=2)
            except kube_errors.KubeError as err:
                return PodState(PodVerdict.UNKNOWN, detail=f"lookup failed: {err}")
        if pod is None:
            return PodState(PodVerdict.GONE)
        return judge_pod(pod, node_name=self._node)


def judge_pod(pod: dict[str, object], *, node_name: str) -> PodState:
    """The verdict on one Pod object read through the API (module docstring)."""
    metadata = pod.get("metadata")
    spec = pod.get("spec")
    status = pod.get("status")
    uid = str(metadata.get("uid", "")) if isinstance(metadata, dict) else ""
    bound_to = spec.get("nodeName") if isinstance(spec, dict) else None
    phase = status.get("phase") if isinstance(status, dict) else None
    if bound_to and bound_to != node_name:
        return PodState(PodVerdict.ELSEWHERE, uid=uid, detail=f"now on node {bound_to}")
    if phase in FINAL_PHASES:
        return PodState(PodVerdict.FINAL, uid=uid, detail=str(phase))
    return PodState(PodVerdict.LIVE, uid=uid)
