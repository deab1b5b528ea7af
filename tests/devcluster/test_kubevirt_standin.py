"""The KubeVirt stand-in does at the API boundary what the reference says virt-controller does.

Facts checked (``kubernetes-kubevirt-kubelet.md`` §1.2–1.4): the launcher
pod's name, labels (the VMI's, the device-refs label among them, then
KubeVirt's), its controller ownerReference to the VMI, one ``compute``
container whose requests and limits carry one unit per ``gpus`` /
``hostDevices`` entry, a VMI ``resources`` key replacing a count instead of
adding to it, placement fields copied, ``status.activePods`` as
``{pod uid: node}``, the phases, and VM start/stop. KubeVirt 1.9's DRA
boundary (renderresources.go ``WithGPUsDRA`` / ``WithHostDevicesDRA``,
``ToPodResourceClaims``): a ``claimName`` entry adds a
``{name, request}`` to the compute container's ``resources.claims`` and no
extended resource, and the VMI's ``resourceClaims`` become the pod's; the
rendering is checked as a pure function, then once against the API server.

On the fast plane (API server only) the test plays kube-scheduler (a
``pods/binding``) and kwok (``pods/status`` Running) itself, and nothing but
the stand-in deletes anything; on the full plane the real scheduler places
the pod on a kwok node and kwok runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cozygpu import keys
from cozygpu.devcluster import nodes
from cozygpu.devcluster.kubevirt import KubeVirtStandIn, launcher_pod
from cozygpu.kube import Client, Obj, resource_path
from tests.support.crds import install_fixture_crd
from tests.support.planes import Fleet

TIMEOUT = 60.0
GPU_A = "nvidia.com/GH100_H100_SXM5_80GB"
GPU_B = "nvidia.com/GA102GL_A10"


def vmis_of(namespace: str) -> str:
    return resource_path("kubevirt.io", "v1", "virtualmachineinstances", namespace=namespace)


def vms_of(namespace: str) -> str:
    return resource_path("kubevirt.io", "v1", "virtualmachines", namespace=namespace)


def pods_of(namespace: str) -> str:
    return resource_path("", "v1", "pods", namespace=namespace)


def vmi_spec(*, gpus: list[str], host_devices: tuple[str, ...] = (), **extra: Any) -> Obj:
    devices: Obj = {"gpus": [{"name": f"gpu{i}", "deviceName": name} for i, name in enumerate(gpus)]}
    if host_devices:
        devices["hostDevices"] = [{"name": f"hd{i}", "deviceName": name} for i, name in enumerate(host_devices)]
    return {"domain": {"devices": devices, "memory": {"guest": "1Gi"}}, **extra}


PLACEMENT: Obj = {
    "nodeSelector": {"pool": "gpu"},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


CLAIM_GPU: Obj = {"name": "dra-gpu", "claimName": "gpus", "requestName": "h100"}
CLAIMS: list[Obj] = [{"name": "gpus", "resourceClaimTemplateName": "one-h100"},
                     {"name": "nics", "resourceClaimName": "shared-nics"}]


def rendered(spec: Obj) -> Obj:
    """The launcher pod ``launcher_pod`` renders for a VMI of ``spec``, as virt-controller reads it."""
    return launcher_pod({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                         "metadata": {"name": "vm-dra", "namespace": "tenant-a", "uid": "vmi-uid"}, "spec": spec})


def dra_spec(*, gpus: list[Obj], host_devices: Sequence[Obj] = (), claims: Sequence[Obj] = tuple(CLAIMS)) -> Obj:
    devices: Obj = {"gpus": gpus, "hostDevices": list(host_devices)}
    return {"domain": {"devices": devices, "memory": {"guest": "1Gi"}}, "resourceClaims": list(claims)}


def compute_of(pod: Obj) -> Obj:
    [compute] = pod["spec"]["containers"]
    resources: Obj = compute["resources"]
    return resources


def test_a_claim_gpu_puts_the_vmi_claims_on_the_pod_and_its_claim_on_compute_and_no_extended_resource() -> None:
    pod = rendered(dra_spec(gpus=[CLAIM_GPU]))

    assert pod["spec"]["resourceClaims"] == CLAIMS
    resources = compute_of(pod)
    # {name, request}, one per entry that uses a claim (renderresources.go WithGPUsDRA).
    assert resources["claims"] == [{"name": "gpus", "request": "h100"}]
    assert "limits" not in resources
    assert set(resources["requests"]) == {"cpu", "memory"}


def test_a_mixed_vmi_counts_its_device_name_entries_and_claims_its_claim_entries_gpus_first() -> None:
    host_claim = {"name": "dra-nic", "claimName": "nics", "requestName": "vf"}
    spec = dra_spec(gpus=[{"name": "gpu0", "deviceName": GPU_A}, CLAIM_GPU],
                    host_devices=[host_claim, {"name": "hd0", "deviceName": GPU_B}])

    resources = compute_of(rendered(spec))

    assert resources["limits"] == {GPU_A: "1", GPU_B: "1"}
    assert {k: v for k, v in resources["requests"].items() if k.startswith("nvidia.com/")} == {GPU_A: "1", GPU_B: "1"}
    assert resources["claims"] == [{"name": "gpus", "request": "h100"}, {"name": "nics", "request": "vf"}]


def test_every_vmi_resource_claim_reaches_the_pod_but_compute_names_only_the_referenced_ones() -> None:
    unused = {"name": "spare", "resourceClaimName": "spare-claim"}
    spec = dra_spec(gpus=[CLAIM_GPU], claims=[unused, *CLAIMS])

    pod = rendered(spec)

    assert pod["spec"]["resourceClaims"] == [unused, *CLAIMS]
    assert compute_of(pod)["claims"] == [{"name": "gpus", "request": "h100"}]


def test_two_entries_of_one_claim_keep_an_entry_each_in_order() -> None:
    second = {"name": "dra-gpu-2", "claimName": "gpus", "requestName": "a10"}
    again = {"name": "dra-gpu-3", "claimName": "gpus", "requestName": "h100"}

    claims = compute_of(rendered(dra_spec(gpus=[CLAIM_GPU, second, again])))["claims"]

    # KubeVirt appends without deduplicating (its admitter refuses a repeated pair; the stand-in does not check).
    assert claims == [{"name": "gpus", "request": "h100"}, {"name": "gpus", "request": "a10"},
                      {"name": "gpus", "request": "h100"}]


def test_an_entry_with_both_a_device_name_and_a_claim_renders_neither() -> None:
    both = {**CLAIM_GPU, "deviceName": GPU_A}

    pod = rendered(dra_spec(gpus=[both]))

    resources = compute_of(pod)
    assert "claims" not in resources
    assert "limits" not in resources
    assert GPU_A not in resources["requests"]
    assert pod["spec"]["resourceClaims"] == CLAIMS  # the VMI's claims still reach the pod


def test_a_vmi_without_claims_renders_no_claim_fields() -> None:
    pod = rendered(vmi_spec(gpus=[GPU_A]))

    assert "resourceClaims" not in pod["spec"]
    assert "claims" not in compute_of(pod)


def device_entry(device: str | None, claim: str | None) -> Obj:
    """A ``gpus``/``hostDevices`` entry with a deviceName, a claim, both or neither."""
    entry: Obj = {"name": "dev"}
    if device:
        entry["deviceName"] = device
    if claim:
        entry.update(claimName=claim, requestName="r")
    return entry


device_entries = st.lists(st.builds(device_entry, st.sampled_from([None, GPU_A, GPU_B]),
                                    st.sampled_from([None, "gpus", "nics"])), max_size=8)


@given(device_entries, device_entries)
def test_each_device_entry_renders_one_unit_or_one_claim_and_never_both(gpus: list[Obj], host: list[Obj]) -> None:
    resources = compute_of(rendered(dra_spec(gpus=gpus, host_devices=host)))

    entries = [*gpus, *host]
    units = sum(int(v) for v in (resources.get("limits") or {}).values())
    assert units == sum(1 for e in entries if "deviceName" in e and "claimName" not in e)
    assert resources.get("claims", []) == [{"name": e["claimName"], "request": "r"} for e in entries
                                           if "claimName" in e and "deviceName" not in e]


class StandIn:
    """A stand-in running for one test, and waits that fail at once when it dies."""

    def __init__(self, client: Client, namespace: str, task: asyncio.Task[None]) -> None:
        self.client, self.namespace, self.task = client, namespace, task

    async def until(self, collection: str, check: Callable[[list[Obj]], Any], *,
                    params: Mapping[str, str] | None = None, what: str) -> Any:
        """List then watch ``collection`` until ``check(objects)`` is truthy; return what it returned."""
        waiter = asyncio.ensure_future(self._until(collection, check, dict(params or {})))
        done, _ = await asyncio.wait({waiter, self.task}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return waiter.result()
        waiter.cancel()
        if self.task in done:
            raise AssertionError(f"the stand-in stopped while waiting for {what}") from self.task.exception()
        raise AssertionError(f"never saw {what}")

    async def _until(self, collection: str, check: Callable[[list[Obj]], Any], params: dict[str, str]) -> Any:
        while True:
            listed = await self.client.list_objects(collection, params=params)
            objects = {o["metadata"]["uid"]: o for o in listed["items"]}
            if result := check(list(objects.values())):
                return result
            watch = {**params, "resourceVersion": listed["metadata"]["resourceVersion"]}
            async for event in self.client.watch(collection, params=watch, read_timeout=TIMEOUT):
                obj = event["object"]
                if event["type"] == "DELETED":
                    objects.pop(obj["metadata"]["uid"], None)
                elif event["type"] in ("ADDED", "MODIFIED"):
                    objects[obj["metadata"]["uid"]] = obj
                if result := check(list(objects.values())):
                    return result

    async def vmi_where(self, name: str, check: Callable[[Obj], bool], *, what: str) -> Obj:
        def found(items: list[Obj]) -> Obj | None:
            return next((o for o in items if check(o)), None)

        result: Obj = await self.until(vmis_of(self.namespace), found, what=f"VMI {name} {what}",
                                       params={"fieldSelector": f"metadata.name={name}"})
        return result

    async def phases(self, name: str, *, since: str) -> list[str]:
        """Every phase the VMI passes through after resourceVersion ``since``, until Running."""
        seen: list[str] = []
        params = {"fieldSelector": f"metadata.name={name}", "resourceVersion": since}
        async for event in self.client.watch(vmis_of(self.namespace), params=params, read_timeout=TIMEOUT):
            phase = (event["object"].get("status") or {}).get("phase")
            if phase and (not seen or seen[-1] != phase):
                seen.append(phase)
            if phase == "Running":
                break
        return seen

    async def launchers(self, vmi_uid: str, check: Callable[[list[Obj]], bool], *, what: str) -> list[Obj]:
        def found(items: list[Obj]) -> tuple[list[Obj]] | None:
            return (items,) if check(items) else None  # truthy even when no pod is what was awaited

        result: tuple[list[Obj]] = await self.until(pods_of(self.namespace), found, what=what,
                                                    params={"labelSelector": f"kubevirt.io/created-by={vmi_uid}"})
        return result[0]


@contextlib.asynccontextmanager
async def running_standin(client: Client, *, make: Callable[[Client, str], KubeVirtStandIn] | None = None,
                          ) -> AsyncIterator[StandIn]:
    """A stand-in over a namespace of its own (``make(client, namespace)`` builds it, when given)."""
    for crd in ("virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io"):
        await install_fixture_crd(client, crd)
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    await client.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": namespace}})
    made = KubeVirtStandIn(client, namespace=namespace) if make is None else make(client, namespace)
    task = asyncio.create_task(made.run())
    try:
        yield StandIn(client, namespace, task)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def standin(admin: Client) -> AsyncIterator[StandIn]:
    async with running_standin(admin) as running:
        yield running


@pytest.fixture
async def full_standin(full_admin: Client) -> AsyncIterator[StandIn]:
    async with running_standin(full_admin) as running:
        yield running


async def create_vmi(standin: StandIn, name: str, spec: Obj, *, labels: Mapping[str, str] | None = None) -> Obj:
    body = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "labels": dict(labels or {})}, "spec": spec}
    created: Obj = await standin.client.create(vmis_of(standin.namespace), body)
    return created


def phase_is(*phases: str) -> Callable[[Obj], bool]:
    return lambda vmi: (vmi.get("status") or {}).get("phase") in phases


def one(pods: list[Obj]) -> bool:
    return len(pods) == 1


def expect_launcher_shape(pod: Obj, vmi: Obj, *, vm_name: str, labels: Mapping[str, str]) -> None:
    """The reference's facts (§1.3) about a launcher pod's metadata."""
    name, uid = vmi["metadata"]["name"], vmi["metadata"]["uid"]
    assert re.fullmatch(rf"virt-launcher-{re.escape(name)}-[a-z0-9]{{5}}", pod["metadata"]["name"])
    assert pod["metadata"]["labels"] == {
        **labels,
        "kubevirt.io": "virt-launcher",
        "kubevirt.io/created-by": uid,
        "vm.kubevirt.io/name": vm_name,
        "vmi.kubevirt.io/id": name,
    }
    assert pod["metadata"]["ownerReferences"] == [{
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": name, "uid": uid,
        "controller": True, "blockOwnerDeletion": True,
    }]


async def test_a_vmi_gets_one_launcher_pod_with_its_labels_owner_devices_and_placement(standin: StandIn) -> None:
    labels = {keys.DEVICE_REFS_LABEL: "true", "app": "db"}
    spec = vmi_spec(gpus=[GPU_A, GPU_A, GPU_B], host_devices=(GPU_A,), **PLACEMENT)
    vmi = await create_vmi(standin, "vm-1.example", spec, labels=labels)

    [pod] = await standin.launchers(vmi["metadata"]["uid"], one, what="the launcher pod")

    expect_launcher_shape(pod, vmi, vm_name="vm-1", labels=labels)
    [compute] = pod["spec"]["containers"]
    assert compute["name"] == "compute"
    resources = compute["resources"]
    # One unit per gpus and hostDevices entry, summed per deviceName, on requests and limits alike.
    assert resources["limits"] == {GPU_A: "3", GPU_B: "1"}
    assert {k: v for k, v in resources["requests"].items() if k.startswith("nvidia.com/")} == {GPU_A: "3", GPU_B: "1"}
    assert set(resources["requests"]) == {GPU_A, GPU_B, "cpu", "memory"}
    assert "resources" not in pod["spec"]
    assert pod["spec"]["nodeSelector"] == PLACEMENT["nodeSelector"]
    assert pod["spec"]["affinity"] == PLACEMENT["affinity"]
    # The API server's DefaultTolerationSeconds adds its own beside the VMI's.
    assert PLACEMENT["tolerations"][0] in pod["spec"]["tolerations"]


async def test_a_vmi_resources_key_for_a_gpu_name_replaces_its_count_instead_of_adding(standin: StandIn) -> None:
    spec = vmi_spec(gpus=[GPU_A, GPU_A])
    spec["domain"]["resources"] = {"requests": {GPU_A: "1"}, "limits": {GPU_A: "1"}}
    vmi = await create_vmi(standin, "vm-both", spec)

    [pod] = await standin.launchers(vmi["metadata"]["uid"], one, what="the launcher pod")

    resources = pod["spec"]["containers"][0]["resources"]
    # KubeVirt >= 0.56: the VMI's own value wins, so two gpus entries give 1, not 2 or 3.
    assert resources["limits"] == {GPU_A: "1"}
    assert resources["requests"][GPU_A] == "1"


async def test_a_launcher_pod_the_api_server_refuses_is_reported_on_the_vmi_which_stays_pending(
    standin: StandIn,
) -> None:
    spec = vmi_spec(gpus=[GPU_A, GPU_A])
    spec["domain"]["resources"] = {"requests": {GPU_A: "1"}}  # limits stay 2: requests != limits
    await create_vmi(standin, "vm-refused", spec)

    def refused(vmi: Obj) -> bool:
        conditions = (vmi.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Synchronized" and c["status"] == "False" for c in conditions)

    vmi = await standin.vmi_where("vm-refused", refused, what="reporting the refused pod")

    [condition] = vmi["status"]["conditions"]
    assert condition["reason"] == "FailedCreate"
    assert f"must be equal to {GPU_A} limit" in condition["message"]
    assert vmi["status"]["phase"] == "Pending"
    assert vmi["status"]["activePods"] == {}
    listed = await standin.client.list_objects(pods_of(standin.namespace))
    assert listed["items"] == []


async def test_a_launcher_with_a_claim_gpu_is_stored_by_the_api_server_with_its_claims_as_rendered(
    standin: StandIn,
) -> None:
    spec = dra_spec(gpus=[{"name": "gpu0", "deviceName": GPU_A}, CLAIM_GPU])
    vmi = await create_vmi(standin, "vm-dra", spec)

    [pod] = await standin.launchers(vmi["metadata"]["uid"], one, what="the launcher pod")

    assert pod["spec"]["resourceClaims"] == CLAIMS
    resources = compute_of(pod)
    assert resources["claims"] == [{"name": "gpus", "request": "h100"}]
    assert resources["limits"] == {GPU_A: "1"}


async def test_a_claim_naming_no_vmi_resource_claim_is_refused_by_the_api_server_and_reported_on_the_vmi(
    standin: StandIn,
) -> None:
    await create_vmi(standin, "vm-dra-lost", dra_spec(gpus=[CLAIM_GPU], claims=CLAIMS[1:]))

    def refused(vmi: Obj) -> bool:
        conditions = (vmi.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Synchronized" and c["status"] == "False" for c in conditions)

    vmi = await standin.vmi_where("vm-dra-lost", refused, what="reporting the refused pod")

    [condition] = vmi["status"]["conditions"]
    assert condition["reason"] == "FailedCreate"
    assert "must be one of the names in pod.spec.resourceClaims: nics" in condition["message"]
    assert vmi["status"]["phase"] == "Pending"


async def test_a_launcher_bound_and_running_is_named_in_active_pods_and_the_vmi_climbs_to_running(
    standin: StandIn,
) -> None:
    client, namespace = standin.client, standin.namespace
    vmi = await create_vmi(standin, "vm-climb", vmi_spec(gpus=[GPU_A]))
    phases = asyncio.ensure_future(standin.phases("vm-climb", since=vmi["metadata"]["resourceVersion"]))
    [pod] = await standin.launchers(vmi["metadata"]["uid"], one, what="the launcher pod")
    uid, pod_path = pod["metadata"]["uid"], f"{pods_of(namespace)}/{pod['metadata']['name']}"

    scheduling = await standin.vmi_where("vm-climb", lambda o: o.get("status", {}).get("activePods") == {uid: ""},
                                         what="listing its unscheduled pod")
    assert scheduling["status"]["phase"] == "Scheduling"
    assert "nodeName" not in scheduling["status"]

    # kube-scheduler's part: bind the pod.
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "node-7"}}
    await client.create(f"{pod_path}/binding", binding)
    bound = await standin.vmi_where("vm-climb", lambda o: o.get("status", {}).get("activePods") == {uid: "node-7"},
                                    what="naming the node of its pod")
    assert bound["status"]["phase"] == "Scheduling"

    # kwok's part: run it.
    await client.merge_patch(f"{pod_path}/status", {"status": {"phase": "Running"}})
    running = await standin.vmi_where("vm-climb", phase_is("Running"), what="Running")

    assert running["status"]["nodeName"] == "node-7"
    assert running["status"]["activePods"] == {uid: "node-7"}
    # One status write per step: no Pending of its own before Scheduling (KubeVirt's comes with the create).
    assert await phases == ["Scheduling", "Scheduled", "Running"]


async def test_a_pod_placed_and_run_while_the_first_pass_writes_is_named_in_its_first_status_write(
    admin: Client, monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[KubeVirtStandIn] = []

    def make(client: Client, namespace: str) -> KubeVirtStandIn:
        made.append(KubeVirtStandIn(client, namespace=namespace))
        return made[-1]

    async with running_standin(admin, make=make) as standin:
        [kubevirt], client, namespace = made, standin.client, standin.namespace
        vmi_path, patch = f"{vmis_of(namespace)}/vm-quick", client.merge_patch
        played: list[str] = []

        async def scheduler_and_kwok_first(path: str, body: Obj, **kw: Any) -> Obj:
            """Before the stand-in's finalizer write: its pod placed and run, and its store told so."""
            if path == vmi_path and not played:
                [pod] = kubevirt.cache.store(kubevirt.pods).list()
                pod_path = f"{pods_of(namespace)}/{pod['metadata']['name']}"
                await client.create(f"{pod_path}/binding", {
                    "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "node-3"}})
                ran = await patch(f"{pod_path}/status", {"status": {"phase": "Running"}})
                await kubevirt.cache.wait_for_resource_version(kubevirt.pods, ran["metadata"]["resourceVersion"])
                played.append(pod["metadata"]["uid"])
            return await patch(path, body, **kw)

        monkeypatch.setattr(client, "merge_patch", scheduler_and_kwok_first)
        vmi = await create_vmi(standin, "vm-quick", vmi_spec(gpus=[GPU_A]))
        phases = await standin.phases("vm-quick", since=vmi["metadata"]["resourceVersion"])

    assert phases == ["Scheduled", "Running"], "the first status write reads the pod as it is by then"
    assert played, "the stand-in wrote its finalizer"


async def test_a_vm_started_gets_a_vmi_from_its_template_and_stopped_loses_it_and_its_pod(standin: StandIn) -> None:
    client, vms = standin.client, vms_of(standin.namespace)
    labels = {keys.DEVICE_REFS_LABEL: "true"}
    template = {"metadata": {"labels": labels, "annotations": {"note": "x"}}, "spec": vmi_spec(gpus=[GPU_B])}
    vm = await client.create(vms, {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                   "metadata": {"name": "vm-life"}, "spec": {"running": True, "template": template}})

    vmi = await standin.vmi_where("vm-life", phase_is("Scheduling"), what="made from its VM")
    assert vmi["metadata"]["ownerReferences"] == [{
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm-life", "uid": vm["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True}]
    assert vmi["metadata"]["labels"] == labels
    assert vmi["metadata"]["annotations"] == {"note": "x"}
    assert vmi["spec"]["domain"]["devices"]["gpus"] == template["spec"]["domain"]["devices"]["gpus"]
    [pod] = await standin.launchers(vmi["metadata"]["uid"], one, what="the launcher pod")
    expect_launcher_shape(pod, vmi, vm_name="vm-life", labels=labels)

    await client.merge_patch(f"{vms}/vm-life", {"spec": {"running": False}})

    await standin.until(vmis_of(standin.namespace), lambda items: items == [], what="the VMI deleted")
    await standin.launchers(vmi["metadata"]["uid"], lambda pods: not pods, what="the launcher pod deleted")


async def test_a_vmi_whose_vm_is_deleted_is_deleted_with_its_pod(standin: StandIn) -> None:
    client, vms = standin.client, vms_of(standin.namespace)
    await client.create(vms, {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm-gone"},
                              "spec": {"runStrategy": "Always", "template": {"spec": vmi_spec(gpus=[GPU_A])}}})
    vmi = await standin.vmi_where("vm-gone", phase_is("Scheduling"), what="made from its VM")

    await client.delete(f"{vms}/vm-gone")

    await standin.until(vmis_of(standin.namespace), lambda items: items == [], what="the VMI deleted")
    await standin.launchers(vmi["metadata"]["uid"], lambda pods: not pods, what="the launcher pod deleted")


async def test_on_the_full_plane_a_started_vm_runs_its_launcher_on_a_kwok_gpu_node_and_stopping_removes_both(
    full_standin: StandIn, fleet: Fleet,
) -> None:
    client, vms, tag = full_standin.client, vms_of(full_standin.namespace), uuid.uuid4().hex[:6]
    resource = f"nvidia.com/TEST_{tag}"
    gpu_node, plain_node = f"kv-gpu-{tag}", f"kv-cpu-{tag}"
    await fleet(nodes.SimNode(gpu_node, {resource: 2}), nodes.SimNode(plain_node))
    labels = {keys.DEVICE_REFS_LABEL: "true"}
    template = {"metadata": {"labels": labels}, "spec": vmi_spec(gpus=[resource, resource])}
    await client.create(vms, {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                              "metadata": {"name": "vm-real"}, "spec": {"running": True, "template": template}})

    vmi = await full_standin.vmi_where("vm-real", phase_is("Running"), what="Running")

    [pod] = await full_standin.launchers(vmi["metadata"]["uid"], one, what="the launcher pod")
    expect_launcher_shape(pod, vmi, vm_name="vm-real", labels=labels)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {resource: "2"}
    # Placed by kube-scheduler on the one node with that resource, run there by kwok.
    assert pod["spec"]["nodeName"] == gpu_node
    assert pod["status"]["phase"] == "Running"
    assert vmi["status"]["activePods"] == {pod["metadata"]["uid"]: gpu_node}
    assert vmi["status"]["nodeName"] == gpu_node

    await client.merge_patch(f"{vms}/vm-real", {"spec": {"running": False}})

    await full_standin.until(vmis_of(full_standin.namespace), lambda items: items == [], what="the VMI deleted")
    await full_standin.launchers(vmi["metadata"]["uid"], lambda pods: not pods, what="the launcher pod deleted")
