"""The VMI webhook's start of a device of a DRA-sourced class (SPEC §1.5, docs/dra.md "Start"), pure.

A GPU held as a ResourceClaim reaches the VM as KubeVirt 1.9 takes DRA
devices: one ``spec.resourceClaims`` entry naming the claim (named after the
GPUDevice) and one ``gpus`` entry per GPU naming that entry and the claim's
request ``gpu-<i>``, never a ``deviceName`` (KubeVirt's admitter refuses an
entry with both). Its answer is ready only once the claim shows its
allocation on the device's node with all its devices: an unallocated claim
would be allocated by kube-scheduler itself, maybe elsewhere. The launcher
pod of DRA devices only is not pinned: kube-scheduler places it by the
claims' allocation.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import attrs
import pytest

from cozygpu import keys
from cozygpu.admission.envelope import Request, Verdict
from cozygpu.admission.pods import LauncherPodWebhook
from cozygpu.admission.refs import parse_refs
from cozygpu.admission.vmi import VMIConfig, VMIWebhook, _Unallocated
from cozygpu.admission.vmi_plan import (
    Member,
    Refused,
    StartPlan,
    claim_unready,
    gpus_patch,
    plan_start,
)
from cozygpu.api import claims as claims_api
from cozygpu.api import kubevirt
from cozygpu.cache.errors import KindNotServed
from cozygpu.cache.frozen import freeze
from cozygpu.cache.kinds import KindSpec
from cozygpu.cache.store import Event
from cozygpu.cache.triggers import Trigger
from cozygpu.devcluster import dra_driver
from cozygpu.devcluster import kubevirt as standin
from cozygpu.model.derive import ModelTables
from cozygpu.model.dra import DeviceRef
from cozygpu.model.refusals import Reason, Refusal, claim_not_allocated
from cozygpu.model.snapshot import Attachment, BindRequest, DeviceView, DraSource, Phase, Snapshot, Toleration
from cozygpu.views import specs
from tests.admission.test_admission_fuzz import FixedSource
from tests.model.factories import H100, NOW, gpu_class, inventory, node

NAMESPACE = "tenant-a"
DRA_NAME = f"deviceclass.resource.kubernetes.io/{dra_driver.DEVICE_CLASS}"
GPU_TOLERATION = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")


def held(name: str, *, cls: str = "dra-h100", count: int = 2, node_name: str = "n1", vmi: str | None = None,
         request: str = "") -> DeviceView:
    return DeviceView(namespace=NAMESPACE, name=name, class_name=cls, count=count, phase=Phase.BOUND,
                      node_name=node_name, uid=f"uid-{name}",
                      attachment=Attachment(vmi=vmi, request_id=request, attached_at=NOW) if vmi else None,
                      bind_request=BindRequest(id=request, vmi=vmi or "", time=NOW) if request else None,
                      created=NOW - timedelta(hours=1))


def world(*devices: DeviceView) -> Snapshot:
    """Nodes n1 and n2, each with 4 DRA GPUs of class ``dra-h100`` and 8 device-plugin H100s of class ``h100``."""
    dra_class = attrs.evolve(gpu_class("dra-h100", resource=DRA_NAME, tolerations=(GPU_TOLERATION,)),
                             dra=DraSource(device_class=dra_driver.DEVICE_CLASS))
    return ModelTables().rebuild(
        now=NOW, classes=[dra_class, gpu_class("h100")], devices=devices, nodes=[node("n1"), node("n2")],
        inventories=[inventory("n1", {H100: 8}), inventory("n2", {H100: 8})], pods=[], vmis=[], namespaces=[],
        dra={"n1": {DRA_NAME: 4}, "n2": {DRA_NAME: 4}})


def vmi_object(name: str, devices: Sequence[str], *, spec: Mapping[str, Any] | None = None,
               domain_devices: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {keys.DEVICE_REFS_LABEL: "true"},
                         "annotations": {keys.DEVICE_REFS_ANNOTATION: json.dumps([{"device": d} for d in devices])}},
            "spec": {"domain": {"devices": dict(domain_devices or {}), "memory": {"guest": "1Gi"}}, **(spec or {})}}


def plan_of(snapshot: Snapshot, vmi: Mapping[str, Any], *, raw_forbidden: bool = True) -> StartPlan:
    refs = parse_refs(kubevirt.device_refs(vmi))
    return plan_start(snapshot, vmi, refs, namespace=NAMESPACE, raw_forbidden=raw_forbidden,
                      grace=timedelta(minutes=2), recent=timedelta(seconds=25))


def apply(obj: Mapping[str, Any], patch: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``obj`` with the JSON patch's ``add`` and ``replace`` operations applied (what the webhook writes)."""
    out = copy.deepcopy(dict(obj))
    for op in patch:
        assert op["op"] in {"add", "replace"}, op
        *parents, last = op["path"].lstrip("/").split("/")
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        value = copy.deepcopy(op["value"])
        if isinstance(target, list):
            if last == "-":
                target.append(value)
            else:
                target.insert(int(last), value)
        else:
            target[last] = value
    return out


def kubevirt_admits(vmi: Mapping[str, Any]) -> None:
    """KubeVirt 1.9's DRA admitter (VEP 10): every claimName names a resourceClaims entry, an entry is DRA or
    device-plugin and never both, (claimName, requestName) pairs are unique; entry names are unique."""
    entries = [e["name"] for e in vmi["spec"].get("resourceClaims") or ()]
    assert len(entries) == len(set(entries)), entries
    pairs = []
    for gpu in vmi["spec"]["domain"]["devices"].get("gpus") or ():
        if "claimName" in gpu or "requestName" in gpu:
            assert "deviceName" not in gpu, gpu
            assert gpu["claimName"] in entries, (gpu, entries)
            pairs.append((gpu["claimName"], gpu["requestName"]))
        else:
            assert gpu.get("deviceName"), gpu
    assert len(pairs) == len(set(pairs)), pairs
    names = [gpu["name"] for gpu in vmi["spec"]["domain"]["devices"].get("gpus") or ()]
    assert len(names) == len(set(names)), names


def started(vmi: Mapping[str, Any], plan: StartPlan) -> dict[str, Any]:
    patch = gpus_patch(vmi, plan.entries, plan.claims)
    assert all("resources" not in op["path"].split("/") for op in patch), patch
    return apply(vmi, patch)


# -- the patch ----------------------------------------------------------------------------------------------


def test_a_dra_device_gets_a_resource_claims_entry_and_one_gpus_entry_per_gpu_naming_its_requests() -> None:
    snapshot = world(held("gpu-a"))
    vmi = vmi_object("vm", ["gpu-a"])
    plan = plan_of(snapshot, vmi)
    assert [m.dra for m in plan.members] == [True]
    assert plan.claims == (kubevirt.ResourceClaim("gpu-a", "gpu-a"),)
    patch = gpus_patch(vmi, plan.entries, plan.claims)
    assert patch == [
        {"op": "add", "path": "/spec/resourceClaims", "value": [{"name": "gpu-a", "resourceClaimName": "gpu-a"}]},
        {"op": "add", "path": "/spec/domain/devices/gpus", "value": [
            {"name": "cozygpu-gpu0", "claimName": "gpu-a", "requestName": "gpu-0"},
            {"name": "cozygpu-gpu1", "claimName": "gpu-a", "requestName": "gpu-1"}]},
    ]
    out = started(vmi, plan)
    kubevirt_admits(out)
    # As KubeVirt renders it: the claim on the pod, one container claim per GPU, no extended resource.
    pod = standin.launcher_pod({**out, "metadata": {**out["metadata"], "uid": "u-vm"}})
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu-a", "resourceClaimName": "gpu-a"}]
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpu-a", "request": "gpu-0"}, {"name": "gpu-a", "request": "gpu-1"}]
    assert DRA_NAME not in resources["requests"]
    assert "limits" not in resources


def test_a_vmi_without_a_devices_object_gets_it_with_the_dra_entries() -> None:
    snapshot = world(held("gpu-a", count=1))
    vmi = vmi_object("vm", ["gpu-a"])
    del vmi["spec"]["domain"]["devices"]
    plan = plan_of(snapshot, vmi)
    out = started(vmi, plan)
    assert out["spec"]["resourceClaims"] == [{"name": "gpu-a", "resourceClaimName": "gpu-a"}]
    assert out["spec"]["domain"]["devices"] == {
        "gpus": [{"name": "cozygpu-gpu0", "claimName": "gpu-a", "requestName": "gpu-0"}]}


def test_a_mix_of_dra_and_device_plugin_devices_gets_each_its_kind_of_entry_in_reference_order() -> None:
    snapshot = world(held("plain", cls="h100", count=1), held("gpu-a"), held("gpu-b", count=1))
    vmi = vmi_object("vm", ["plain", "gpu-a", "gpu-b"])
    plan = plan_of(snapshot, vmi)
    assert [(m.name, m.dra) for m in plan.members] == [("plain", False), ("gpu-a", True), ("gpu-b", True)]
    out = started(vmi, plan)
    kubevirt_admits(out)
    assert out["spec"]["resourceClaims"] == [{"name": "gpu-a", "resourceClaimName": "gpu-a"},
                                             {"name": "gpu-b", "resourceClaimName": "gpu-b"}]
    assert out["spec"]["domain"]["devices"]["gpus"] == [
        {"name": "cozygpu-gpu0", "deviceName": H100},
        {"name": "cozygpu-gpu1", "claimName": "gpu-a", "requestName": "gpu-0"},
        {"name": "cozygpu-gpu2", "claimName": "gpu-a", "requestName": "gpu-1"},
        {"name": "cozygpu-gpu3", "claimName": "gpu-b", "requestName": "gpu-0"},
    ]
    pod = standin.launcher_pod({**out, "metadata": {**out["metadata"], "uid": "u-vm"}})
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"][H100] == resources["limits"][H100] == "1"
    assert [c["name"] for c in resources["claims"]] == ["gpu-a", "gpu-a", "gpu-b"]


def test_a_reinvocation_adds_nothing_twice_and_its_own_entries_are_not_raw_gpu_names() -> None:
    snapshot = world(held("plain", cls="h100", count=1), held("gpu-a"))
    vmi = vmi_object("vm", ["plain", "gpu-a"], spec={"resourceClaims": [{"name": "other", "resourceClaimName": "x"}]})
    once = started(vmi, plan_of(snapshot, vmi))
    # Called again on what the first call made (raw names forbidden: our own DRA entries are not the tenant's).
    again = plan_of(snapshot, once, raw_forbidden=True)
    assert gpus_patch(once, again.entries, again.claims) == []
    assert once["spec"]["resourceClaims"] == [{"name": "other", "resourceClaimName": "x"},
                                              {"name": "gpu-a", "resourceClaimName": "gpu-a"}]


def test_a_tenants_own_dra_gpus_entry_is_a_raw_gpu_entry_where_raw_names_are_forbidden() -> None:
    snapshot = world(held("gpu-a", count=1))
    own = {"name": "mine", "claimName": "gpu-a", "requestName": "gpu-0"}
    vmi = vmi_object("vm", ["gpu-a"], domain_devices={"gpus": [own]})
    with pytest.raises(Refused, match=r"gpus entry 'mine' \(gpu-a\)"):
        plan_of(snapshot, vmi, raw_forbidden=True)


def test_the_vmis_other_resource_claims_are_kept_and_a_taken_or_invalid_entry_name_is_not_reused() -> None:
    snapshot = world(held("gpu-a", count=1), held("gpu.b", count=1), held("gpu-c", count=1))
    others = [{"name": "gpu-a", "resourceClaimName": "someone-elses"},
              {"name": "cozygpu-claim0", "resourceClaimTemplateName": "scratch"}]
    vmi = vmi_object("vm", ["gpu-a", "gpu.b", "gpu-c"], spec={"resourceClaims": copy.deepcopy(others)})
    plan = plan_of(snapshot, vmi, raw_forbidden=False)
    # gpu-a's own name is another entry's; gpu.b is no DNS label (a pod's claim entry must be one).
    assert plan.claims == (kubevirt.ResourceClaim("cozygpu-claim1", "gpu-a"),
                           kubevirt.ResourceClaim("cozygpu-claim2", "gpu.b"),
                           kubevirt.ResourceClaim("gpu-c", "gpu-c"))
    patch = gpus_patch(vmi, plan.entries, plan.claims)
    assert [op["path"] for op in patch][:3] == ["/spec/resourceClaims/-"] * 3
    out = apply(vmi, patch)
    kubevirt_admits(out)
    assert out["spec"]["resourceClaims"][:2] == others
    assert [g["claimName"] for g in out["spec"]["domain"]["devices"]["gpus"]] == [
        "cozygpu-claim1", "cozygpu-claim2", "gpu-c"]


def test_an_entry_the_vmi_has_for_the_claim_already_is_the_one_its_gpus_entries_name() -> None:
    snapshot = world(held("gpu-a", count=1))
    vmi = vmi_object("vm", ["gpu-a"], spec={"resourceClaims": [{"name": "mine", "resourceClaimName": "gpu-a"}]})
    plan = plan_of(snapshot, vmi, raw_forbidden=False)
    assert plan.claims == (kubevirt.ResourceClaim("mine", "gpu-a"),)
    assert gpus_patch(vmi, plan.entries, plan.claims) == [
        {"op": "add", "path": "/spec/domain/devices/gpus",
         "value": [{"name": "cozygpu-gpu0", "claimName": "mine", "requestName": "gpu-0"}]}]


def test_a_template_of_a_dra_class_is_a_dra_member_named_after_its_device() -> None:
    snapshot = world()
    vmi = vmi_object("vm", [])
    vmi["metadata"]["annotations"][keys.DEVICE_REFS_ANNOTATION] = json.dumps(
        [{"template": "gpu", "class": "dra-h100", "count": 1}])
    plan = plan_of(snapshot, vmi)
    (member,) = plan.members
    assert member.dra
    assert member.existing is None
    assert plan.claims == (kubevirt.ResourceClaim(member.name, member.name),)
    assert plan.entries == (kubevirt.GPU("cozygpu-gpu0", "", member.name, "gpu-0"),)


def test_a_vmi_with_more_resource_claims_than_admission_reads_is_refused_naming_the_list() -> None:
    vmi = vmi_object("vm", ["gpu-a"], spec={"resourceClaims": [{"name": f"c{i}"} for i in range(257)]})
    with pytest.raises(Refused, match=r"spec\.resourceClaims: 257 entries, at most 256"):
        plan_of(world(held("gpu-a")), vmi)


# -- when a DRA member's answer is ready --------------------------------------------------------------------


def hold(device: str = "gpu-a", *, node_name: str | None = "n1", devices: int = 2, owner: str | None = None,
         ) -> dict[str, Any]:
    """The binder's claim of ``device`` (``node_name`` None: not allocated), holding ``devices`` devices."""
    claim = claims_api.hold_claim(owner or device, f"uid-{owner or device}", device_class=dra_driver.DEVICE_CLASS,
                                  count=2)
    claim["metadata"].update(name=device, namespace=NAMESPACE)
    if node_name is not None:
        refs = [DeviceRef(dra_driver.DRIVER, node_name, dra_driver.device_name(i)) for i in range(devices)]
        claim["status"] = claims_api.hold_status(node_name, refs, device_name=device, device_uid=f"uid-{device}",
                                                 now=NOW)
    return claim


def test_a_dra_members_answer_is_ready_only_with_its_claim_allocated_on_its_node_with_all_its_devices() -> None:
    def unready(claim: Mapping[str, Any] | None) -> str:
        return claim_unready(claim, device="gpu-a", node="n1", count=2)

    assert unready(hold()) == ""
    assert unready(None) == "does not exist yet"
    assert unready(hold(node_name=None)) == "is not allocated yet"
    assert unready(hold(node_name="n2")) == "is allocated on node n2"
    assert unready(hold(devices=1)) == "holds 1 device(s), not 2"
    assert unready(hold(owner="gpu-z")) == "is not owned by GPUDevice gpu-a"


def test_a_claim_not_allocated_in_time_is_refused_naming_the_device_the_claim_and_the_node() -> None:
    refusal = claim_not_allocated(NAMESPACE, "gpu-a", vmi_subject="VMI tenant-a/vm", node="n1",
                                  seen="is allocated on node n2", wait=5.0)
    assert refusal.reason is Reason.CLAIM_NOT_ALLOCATED
    assert refusal.message == (
        "VMI tenant-a/vm: ResourceClaim tenant-a/gpu-a, the hold of GPUDevice tenant-a/gpu-a, was not allocated on "
        "node n1 within 5 s (it is allocated on node n2); nothing was kept")


class Caches:
    """The webhook's cache: a store per kind, triggers fired as the informers would (``when`` applied), and
    the ResourceClaim kind served or not."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[tuple[str, str], Any]] = {specs.GPU_DEVICES.key: {},
                                                               specs.RESOURCE_CLAIMS.key: {}}
        self.claims_served = True
        self.triggers: list[tuple[frozenset[str], Mapping[str, Callable[[Event], bool]], Trigger]] = []

    def store(self, spec: KindSpec) -> Caches.Store:
        if spec.key == specs.RESOURCE_CLAIMS.key and not self.claims_served:
            raise KindNotServed(spec.key, "discovery lists no resource.k8s.io/v1")
        return Caches.Store(self.objects[spec.key])

    def informer(self, spec: KindSpec) -> Caches:
        return self

    def trigger(self, *watched: KindSpec, name: str = "",
                when: Mapping[str, Callable[[Event], bool]] | None = None) -> Trigger:
        trigger = Trigger(name)
        self.triggers.append((frozenset(s.key for s in watched), dict(when or {}), trigger))
        return trigger

    def remove_trigger(self, trigger: Trigger) -> None:
        self.triggers = [t for t in self.triggers if t[2] is not trigger]

    def put(self, spec: KindSpec, obj: dict[str, Any]) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        self.objects[spec.key][key] = obj
        event = Event(spec.key, "MODIFIED", freeze(obj))
        for kinds, when, trigger in self.triggers:
            passes = when.get(spec.key)
            if spec.key in kinds and (passes is None or passes(event)):
                trigger.fire(spec.key)

    class Store:
        def __init__(self, objects: dict[tuple[str, str], Any]) -> None:
            self.objects = objects

        def get(self, namespace: str, name: str) -> Any:
            return self.objects.get((namespace, name))


def answered(name: str, request_id: str, *, node_name: str = "n1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NAMESPACE},
            "status": {"phase": "Bound", "nodeName": node_name,
                       "bindAnswer": {"id": request_id, "result": "Succeeded", "node": node_name, "reason": "Bound",
                                      "message": ""}}}


def dra_plan(*members: Member) -> StartPlan:
    return StartPlan(namespace=NAMESPACE, vmi="vm", node="n1", adopted_request="r1", entries=(), members=members)


def webhook(cache: Caches, *, bind_wait: float = 5.0, source: Snapshot | None = None) -> VMIWebhook:
    return VMIWebhook(cache, None, FixedSource(source or world()),  # type: ignore[arg-type]
                      VMIConfig(namespace="cozy-gpu", bind_wait=bind_wait, raw_forbidden=True))


DRA_A = Member(name="gpu-a", class_name="dra-h100", count=2, existing=None, template=False, dra=True)
PLAIN = Member(name="plain", class_name="h100", count=1, existing=None, template=False)


def test_the_answer_of_a_dra_member_waits_for_its_claim_and_a_device_plugin_members_does_not() -> None:
    cache = Caches()
    hook = webhook(cache)
    plan = dra_plan(PLAIN, DRA_A)
    cache.put(specs.GPU_DEVICES, answered("plain", "r1"))
    cache.put(specs.GPU_DEVICES, answered("gpu-a", "r1"))
    assert hook._answers(plan, "r1", set()) == _Unallocated(device="gpu-a", node="n1", seen="does not exist yet")
    cache.put(specs.RESOURCE_CLAIMS, hold(node_name="n2"))
    assert hook._answers(plan, "r1", set()) == _Unallocated(device="gpu-a", node="n1",
                                                            seen="is allocated on node n2")
    cache.put(specs.RESOURCE_CLAIMS, hold())
    assert hook._answers(plan, "r1", set()) is True
    assert hook._answers(dra_plan(PLAIN), "r1", set()) is True
    cache.claims_served = False
    refusal = hook._answers(plan, "r1", set())
    assert isinstance(refusal, Refusal)
    assert refusal.reason is Reason.DRA_NOT_SERVED
    assert "serves no resource.k8s.io/v1" in refusal.message
    assert "GPUDevice tenant-a/gpu-a" in refusal.message


def test_the_wait_is_woken_by_the_claims_allocation_and_allows() -> None:
    async def run() -> None:
        cache = Caches()
        hook = webhook(cache)
        cache.put(specs.GPU_DEVICES, answered("gpu-a", "r1"))
        cache.put(specs.RESOURCE_CLAIMS, hold(node_name=None))
        waiting = asyncio.create_task(hook._await_answers(dra_plan(DRA_A), "r1"))
        await asyncio.sleep(0)
        assert not waiting.done()
        (watched, when, _trigger), = cache.triggers
        assert watched == {specs.GPU_DEVICES.key, specs.RESOURCE_CLAIMS.key}
        other = hold("gpu-z")
        assert not when[specs.RESOURCE_CLAIMS.key](Event(specs.RESOURCE_CLAIMS.key, "ADDED", freeze(other))), \
            "another device's claim does not wake the wait"
        cache.put(specs.RESOURCE_CLAIMS, hold())
        assert await asyncio.wait_for(waiting, 1.0) is None
        assert cache.triggers == [], "the trigger is removed from every informer"

    asyncio.run(run())


def test_a_claim_never_allocated_on_its_node_within_the_bind_wait_is_refused_with_what_it_showed() -> None:
    async def run() -> None:
        cache = Caches()
        hook = webhook(cache, bind_wait=0.05)
        cache.put(specs.GPU_DEVICES, answered("gpu-a", "r1"))
        cache.put(specs.RESOURCE_CLAIMS, hold(devices=1))
        refusal = await hook._await_answers(dra_plan(DRA_A), "r1")
        assert refusal == claim_not_allocated(NAMESPACE, "gpu-a", vmi_subject="VMI tenant-a/vm", node="n1",
                                              seen="holds 1 device(s), not 2", wait=0.05)

    asyncio.run(run())


def request(obj: Mapping[str, Any], *, dry_run: bool = True) -> Request:
    return Request(uid="u-1", operation="CREATE", namespace=NAMESPACE, name="", object=obj, dry_run=dry_run,
                   kind="VirtualMachineInstance", user="someone")


def test_a_dry_run_is_allowed_with_the_resource_claims_entries_and_refused_where_claims_are_not_served() -> None:
    cache = Caches()
    snapshot = world(held("gpu-a", count=1))
    cache.put(specs.GPU_DEVICES, {"metadata": {"name": "gpu-a", "namespace": NAMESPACE, "resourceVersion": "7"}})
    vmi = vmi_object("vm", ["gpu-a"])
    verdict = asyncio.run(webhook(cache, source=snapshot)(request(vmi)))
    assert verdict == Verdict.allow([
        {"op": "add", "path": "/spec/resourceClaims", "value": [{"name": "gpu-a", "resourceClaimName": "gpu-a"}]},
        {"op": "add", "path": "/spec/domain/devices/gpus",
         "value": [{"name": "cozygpu-gpu0", "claimName": "gpu-a", "requestName": "gpu-0"}]}])
    cache.claims_served = False
    verdict = asyncio.run(webhook(cache, source=snapshot)(request(vmi)))
    assert not verdict.allowed
    assert verdict.message == (
        "GPUDevice tenant-a/gpu-a: its class dra-h100 takes its GPUs "
        "from a DRA driver, and the cluster serves no resource.k8s.io/v1 ResourceClaims (discovery lists no "
        "resource.k8s.io/v1)")
    # A VMI of device-plugin devices does not read the claims at all.
    plain = world(held("plain", cls="h100", count=1))
    cache.put(specs.GPU_DEVICES, {"metadata": {"name": "plain", "namespace": NAMESPACE, "resourceVersion": "8"}})
    assert asyncio.run(webhook(cache, source=plain)(request(vmi_object("vm", ["plain"])))).allowed


# -- the launcher pod ---------------------------------------------------------------------------------------


def launcher(vmi: str = "vm") -> dict[str, Any]:
    owner = {"kind": "VirtualMachineInstance", "apiVersion": "kubevirt.io/v1", "name": vmi, "uid": "u-vm",
             "controller": True}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"virt-launcher-{vmi}-abcde", "namespace": NAMESPACE, "ownerReferences": [owner]},
            "spec": {"containers": [{"name": "compute", "image": "virt-launcher"}]}}


def pod_verdict(snapshot: Snapshot) -> Verdict:
    pod = launcher()
    return asyncio.run(LauncherPodWebhook(FixedSource(snapshot))(Request(
        uid="u-1", operation="CREATE", namespace=NAMESPACE, name="", object=pod, dry_run=False, kind="Pod",
        user="kubevirt-controller")))


def test_the_launcher_of_dra_devices_only_is_not_pinned_and_gets_its_classes_tolerations() -> None:
    verdict = pod_verdict(world(held("gpu-a", vmi="vm", request="r1"), held("gpu-b", count=1, vmi="vm")))
    assert verdict.allowed
    assert list(verdict.patch) == [{"op": "add", "path": "/spec/tolerations", "value": [
        {"operator": "Exists", "key": "nvidia.com/gpu", "effect": "NoSchedule"}]}]


def test_the_launcher_of_a_mix_of_dra_and_device_plugin_devices_is_pinned_to_their_node() -> None:
    verdict = pod_verdict(world(held("gpu-a", vmi="vm"), held("plain", cls="h100", count=1, vmi="vm")))
    assert verdict.allowed
    assert [op["path"] for op in verdict.patch] == ["/spec/affinity", "/spec/tolerations"]
    assert verdict.patch[0]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}


def test_the_launcher_of_dra_devices_not_bound_is_still_refused() -> None:
    pending = DeviceView(namespace=NAMESPACE, name="gpu-a", class_name="dra-h100", count=1,
                         attachment=Attachment(vmi="vm"), created=NOW)
    verdict = pod_verdict(world(pending))
    assert not verdict.allowed
    assert "not Bound" in verdict.message
