"""The VMI webhook's promise over random clusters: it never accepts a template order the GPUDevice webhook refuses.

A template device is an order like any other; if the start's check counted
less than ``placement.order_check`` (the GPUDevice webhook's), a template
could jump ahead of an order admitted earlier under the same budget (R-MOD-4).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import attrs
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.admission.refs import DeviceRef, Ref, TemplateRef
from cozygpu.admission.vmi_plan import Refused, plan_start
from cozygpu.model.budgets import add_usage, demand_usage
from cozygpu.model.placement import order_check
from cozygpu.model.snapshot import EMPTY_USAGE, Snapshot
from cozygpu.model.tenants import ancestry
from tests.model.factories import device, snapshot
from tests.model.test_compaction import fragmented
from tests.model.test_placement_answers import TENANTS, clusters, describe


def vmi_object(name: str, refs: list[Ref]) -> dict[str, Any]:
    raw = [{"device": r.device} if isinstance(r, DeviceRef) else
           {"template": r.template, "class": r.class_name, "count": r.count} for r in refs]
    return {"metadata": {"name": name, "labels": {keys.DEVICE_REFS_LABEL: "true"},
                         "annotations": {keys.DEVICE_REFS_ANNOTATION: json.dumps(raw)}},
            "spec": {"domain": {"devices": {}}}}


@settings(max_examples=400, deadline=None, derandomize=True)
@given(snap=clusters(), data=st.data())
def test_a_start_never_accepts_a_template_order_the_gpudevice_webhook_would_refuse(snap: Snapshot,
                                                                                 data: st.DataObject) -> None:
    namespace = data.draw(st.sampled_from(TENANTS))
    mine = sorted(name for (ns, name) in snap.devices if ns == namespace)
    refs: list[Ref] = [DeviceRef(n) for n in data.draw(st.lists(st.sampled_from(mine), unique=True, max_size=2))
                       ] if mine else []
    templates = [TemplateRef(f"t{i}", data.draw(st.sampled_from(["h100", "a10"])),
                             data.draw(st.integers(min_value=1, max_value=3)))
                 for i in range(data.draw(st.integers(min_value=1, max_value=2)))]
    refs.extend(templates)
    try:
        plan_start(snap, vmi_object("vm-new", refs), refs, namespace=namespace, raw_forbidden=False,
                   grace=timedelta(minutes=2), recent=timedelta(seconds=25))
    except Refused:
        return
    note(describe(snap))
    # The templates are created one after another, each through the GPUDevice webhook, which then counts
    # the earlier ones among the subtree's orders not yet accepted.
    seen = snap
    for template in templates:
        refusal = order_check(seen, namespace, template.class_name, template.count).refusal
        assert refusal is None, f"start accepted {template}, the GPUDevice webhook refuses: {refusal}"
        seen = with_pending(seen, namespace, template)


def with_pending(snap: Snapshot, namespace: str, template: TemplateRef) -> Snapshot:
    """``snap`` with one more order not yet accepted in ``namespace`` (what a created template device adds)."""
    added = demand_usage({template.class_name: template.count}, snap.classes)
    pending = dict(snap.pending_usage)
    for tenant in ancestry(namespace):
        pending[tenant] = add_usage(pending.get(tenant, EMPTY_USAGE), added)
    return attrs.evolve(snap, pending_usage=pending)


def test_two_templates_that_fit_the_budget_alone_but_not_beside_an_earlier_order_are_refused() -> None:
    # Budget 2 over tenant-a; an earlier order of 1 is admitted but not accepted yet; two templates of 1 each
    # fit beside it one by one, not together.
    snap = snapshot(devices=[device("earlier", count=1)],
                    quotas={"tenant-a": {f"requests.{keys.QUOTA_TOTAL}": "2"}})
    refs: list[Ref] = [TemplateRef("a", "h100", 1), TemplateRef("b", "h100", 1)]
    with pytest.raises(Refused, match=r"budget gpu\.cozystack\.io/total of tenant-a: 2 allowed, 1 in use, "
                                      r"order of 2 exceeds it by 1"):
        plan_start(snap, vmi_object("vm", refs), refs, namespace="tenant-a", raw_forbidden=False,
                   grace=timedelta(minutes=2), recent=timedelta(seconds=25))
    # The earlier order itself, named by the start, is counted once: as a member.
    refs = [DeviceRef("earlier"), TemplateRef("a", "h100", 1)]
    plan = plan_start(snap, vmi_object("vm", refs), refs, namespace="tenant-a", raw_forbidden=False,
                      grace=timedelta(minutes=2), recent=timedelta(seconds=25))
    assert [m.name for m in plan.members][:1] == ["earlier"]


def test_a_start_whose_template_order_needs_compaction_is_accepted_and_its_answer_says_where() -> None:
    # Four 4-GPU nodes with three stopped single-GPU holds each: a template of 4 fits nowhere as things stand.
    snap = fragmented()
    refs: list[Ref] = [TemplateRef("gpus", "h100", 4)]
    plan = plan_start(snap, vmi_object("vm-big", refs), refs, namespace="tenant-a", raw_forbidden=False,
                      grace=timedelta(minutes=2), recent=timedelta(seconds=25))
    assert plan.node == "n0"
    assert plan.said == "VMI tenant-a/vm-big: placed on n0 after moving 3 stopped holds"
