"""Every order the binder does not place reads Pending, with the reason, on the full plane (SPEC 1.2, R-BIND-6).

Nine orders race for the three units of one kwok node. The binder binds
three; every other one must read ``phase: Pending`` — in the object, in the
API server's printer column and in ``cozygpu why`` alike — beside the
``Bound=False`` condition that says why. Before, such an order had the
condition but no phase: ``kubectl get`` showed an empty column while ``why``
called it Pending.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from cozygpu import keys
from cozygpu.commands import common, why
from cozygpu.devcluster import nodes
from cozygpu.kube import Client
from tests.binder.support import device_path
from tests.binder.world import World, driven_binder
from tests.support.planes import Fleet
from tests.support.waiting import eventually

NAMESPACES = "/api/v1/namespaces"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


async def test_nine_racing_orders_for_three_units_leave_six_pending_with_their_reason_everywhere(
        full_admin: Client, fleet: Fleet) -> None:
    admin = full_admin
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    await admin.create(NAMESPACES, {"metadata": {"name": namespace}})
    world = await World.make(admin, namespace)
    await fleet(nodes.SimNode(world.node_name("gpu"), gpus={world.resource: 3}))
    await world.node("gpu", 3, create_node=False)
    names = [f"o{i}" for i in range(9)]
    async with driven_binder(admin, timedelta(seconds=30)):
        await asyncio.gather(*(admin.create(device_path(namespace), {
            "apiVersion": keys.API_VERSION, "kind": keys.GPUDEVICE_KIND, "metadata": {"name": name},
            "spec": {"className": world.gpu_class, "count": 1}}) for name in names))

        async def decided() -> list[dict[str, Any]] | None:
            devices = [await admin.get(device_path(namespace, name)) for name in names]
            conditions = [next((c for c in (d.get("status") or {}).get("conditions") or ()
                                if c.get("type") == "Bound"), None) for d in devices]
            return devices if all(conditions) else None

        devices = await eventually(decided, timeout=60, what="every order bound or kept Pending with a reason")
    assert devices is not None
    phases = sorted(d["status"].get("phase") for d in devices)
    assert phases == ["Bound"] * 3 + ["Pending"] * 6, phases
    waiting = [d for d in devices if d["status"]["phase"] == "Pending"]
    for device in waiting:
        condition = next(c for c in device["status"]["conditions"] if c["type"] == "Bound")
        assert (condition["status"], condition["reason"]) == ("False", "NoNodeWithRoom"), condition
    table = await admin.get(device_path(namespace), headers={"Accept": TABLE})
    column = [c["name"] for c in table["columnDefinitions"]].index("Phase")
    shown = {row["object"]["metadata"]["name"]: row["cells"][column] for row in table["rows"]}
    cluster = await common.read_cluster(admin)
    for device in waiting:
        name = device["metadata"]["name"]
        assert shown[name] == "Pending", f"kubectl get shows {shown[name]!r} for {name}"
        report = await why.explain_device(admin, cluster, namespace, name)
        assert report is not None
        assert (report["phase"], report["reason"]) == ("Pending", "NoNodeWithRoom"), report
