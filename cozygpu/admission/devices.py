"""The GPUDevice webhooks: refuse an order that cannot be met now (validating, CREATE, R-ADM-1), and
give an order its finalizer as it is created (mutating, CREATE, R-BIND-9).

The check is the model's ``placement.order_check`` (``catalog.order_refusal``,
the one the catalog shows and the binder re-checks: unknown or deleting
class, count and maxCount, KubeVirt's permittedHostDevices, the VGPU
entitlement, every budget of the tenant and its ancestors (counting the
subtree's orders not yet accepted, R-MOD-4), a raw-key block, the class's
free units in the cluster and on one node), where an order no node has room
for is accepted when moving stopped holds makes room (R-BIND-11), the answer's
warning saying so. The refusal message names the limit and the numbers.

Bounded (issue 22): the check compares the count with maxCount, budgets and
free units, never builds anything sized by it; names longer than Kubernetes
allows (a class name is a DNS label) are refused before they are looked up,
and a message quotes them cut short.

The finalizer comes with the object (``DeviceFinalizerWebhook`` on a
cluster before 1.36; the chart's MutatingAdmissionPolicy from 1.36, with
this hook not registered), so the order's one write on its way to Bound is
its status patch: the binder's finalizer reconciler still adds it wherever
it is missing (an order created while neither was in force), and still
removes it on deletion.
"""

from __future__ import annotations

from cozygpu import keys
from cozygpu.admission import bounds
from cozygpu.admission.envelope import Request, Verdict
from cozygpu.admission.view import NotReady, SnapshotSource
from cozygpu.api import admission_devices as devices
from cozygpu.api import meta
from cozygpu.model import refusals
from cozygpu.model.placement import order_check


class DeviceWebhook:
    def __init__(self, source: SnapshotSource) -> None:
        self._source = source

    async def __call__(self, request: Request) -> Verdict:
        if request.operation != "CREATE":
            return Verdict.allow()
        obj = request.object
        namespace = request.namespace or meta.namespace(obj)
        name = meta.name(obj) or request.name or "?"
        label = f"GPUDevice {bounds.clip(namespace)}/{bounds.clip(name)}"
        wanted = devices.order(obj)
        if wanted is None:
            return Verdict.refuse(refusals.invalid_order(label))
        class_name, count = wanted.class_name, wanted.count
        for what, value, limit in (("metadata.name", name, bounds.MAX_NAME),
                                   ("namespace", namespace, bounds.MAX_NAMESPACE),
                                   ("spec.className", class_name, bounds.MAX_NAMESPACE)):
            refusal = bounds.name_problem(label, what, value, limit)
            if refusal is not None:
                return Verdict.refuse(refusal)
        try:
            snapshot = await self._source.snapshot()
        except NotReady as error:
            return Verdict.not_ready(str(error))
        check = order_check(snapshot, namespace, class_name, count, label=name)
        if check.refusal is None:
            # A compaction is said as the answer's warning: the order is placed once stopped holds moved.
            return Verdict.allow(message=f"{label}: {check.compaction.said()}" if check.compaction else "")
        return Verdict.refuse(refusals.order_refused(label, check.refusal))


class DeviceFinalizerWebhook:
    """Mutating, CREATE: the order's finalizer added, reading nothing but the object (no cache, no wait)."""

    async def __call__(self, request: Request) -> Verdict:
        if request.operation != "CREATE":
            return Verdict.allow()
        finalizers = devices.finalizer_list(request.object)
        if finalizers is None:
            return Verdict.allow([{"op": "add", "path": "/metadata/finalizers", "value": [keys.DEVICE_FINALIZER]}])
        if keys.DEVICE_FINALIZER in finalizers:
            return Verdict.allow()
        return Verdict.allow([{"op": "add", "path": "/metadata/finalizers/-", "value": keys.DEVICE_FINALIZER}])
