"""The VMI webhook's wait for the binder's answer reads a template device it just created right.

A start creates its template devices and then waits, on every GPUDevice event,
for every member's answer. This replica's cache may show another device's event
before the create's own: a created device missing from the cache then is the
watch not having caught up, not a deletion. Before, such a start was refused
with "was deleted while VMI ... was being admitted" (seen in bursts of starts).
A device that was seen and then went is still a deletion.
"""

from __future__ import annotations

from typing import Any

from cozygpu.admission.vmi import VMIConfig, VMIWebhook
from cozygpu.admission.vmi_plan import Member, StartPlan
from cozygpu.model import refusals
from tests.admission.test_admission_fuzz import SOURCE

NAMESPACE = "tenant-a"


class Store:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}

    def store(self, _spec: object) -> Store:
        return self

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((namespace, name))


def answered(name: str, request_id: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NAMESPACE},
            "status": {"bindAnswer": {"id": request_id, "result": "Succeeded", "node": "n1", "reason": "Bound",
                                      "message": ""}}}


def test_a_created_device_the_cache_has_not_shown_is_no_answer_yet_and_one_seen_then_gone_is_deleted() -> None:
    cache = Store()
    webhook = VMIWebhook(cache, None, SOURCE,  # type: ignore[arg-type]
                         VMIConfig(namespace="cozy-gpu", bind_wait=1.0, raw_forbidden=True))
    plan = StartPlan(namespace=NAMESPACE, vmi="vm", node="n1", adopted_request="", entries=(),
                     members=(Member(name="vm-gpu-0", class_name="h100", count=1, existing=None, template=True),))
    unseen = {m.name for m in plan.to_create}
    assert webhook._answers(plan, "r1", unseen) is None, "not in the cache yet: wait, do not refuse"
    cache.objects[(NAMESPACE, "vm-gpu-0")] = answered("vm-gpu-0", "r1")
    assert webhook._answers(plan, "r1", unseen) is True
    del cache.objects[(NAMESPACE, "vm-gpu-0")]
    assert webhook._answers(plan, "r1", unseen) == refusals.device_deleted_while_admitting(
        NAMESPACE, "vm-gpu-0", vmi="vm"), "seen, then gone: a deletion"
