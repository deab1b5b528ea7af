"""The main job end to end: a local plane, the demo's story checked from the API server, a second run, a stop."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from cozygpu import keys
from cozygpu.base.durations import parse_duration
from cozygpu.binder.ledger import EXPIRING_CONDITION, REASON_EXPIRED
from cozygpu.devcluster import demo as demo_module
from cozygpu.devcluster import dra_driver, replicas, story
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, errors, resource_path
from tests.support.processes import gone


def cozygpu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cozygpu", *args], capture_output=True, text=True,
                          check=False, timeout=180)


#: The story's steps and the catalog after them.
STEPS = 11


def story_lines(stdout: str) -> dict[str, list[str]]:
    """The printed story by step ("1." … "11."): each step's heading and the lines under it."""
    steps: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        head = line.split(" ", 1)[0]
        if head in {f"{n}." for n in range(1, STEPS + 1)}:
            current = steps.setdefault(head, [])
        elif line.startswith("continue by hand"):
            current = None
        if current is not None:
            current.append(line)
    return steps


async def api_outcomes(plane: ControlPlane) -> dict[str, Any]:
    """What the story left, read from the API server (not from what the demo printed)."""
    async with plane.client() as admin:
        train = await admin.get(story.device_path(story.ACME, story.HELD))
        events = (await admin.list_objects(resource_path("", "v1", "events", namespace=story.ACME), params={
            "fieldSelector": f"involvedObject.name={story.HELD}"}))["items"]
        vm = await admin.get(story.kubevirt_path("virtualmachines", story.ACME, story.VM))
        nodes = (await admin.list_objects("/api/v1/nodes"))["items"]
        reports = {n["metadata"]["name"]: n["status"]["agent"]["lastReport"] for n in (await admin.list_objects(
            resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL)))["items"]}
        return {
            "train": train["status"],
            "events": [(e["reason"], e["message"]) for e in events],
            "vm_running": vm["spec"]["running"],
            "vmis": {ns: [v["metadata"]["name"] for v in (await admin.list_objects(
                story.kubevirt_path("virtualmachineinstances", ns)))["items"]] for ns in story.NAMESPACES},
            "devices": {ns: [d["metadata"]["name"] for d in (await admin.list_objects(
                story.device_path(ns)))["items"]] for ns in story.NAMESPACES},
            "launchers": [p["metadata"]["name"] for p in (await admin.list_objects(
                resource_path("", "v1", "pods", namespace=story.ACME)))["items"]],
            "cordoned": [n["metadata"]["name"] for n in nodes if n["spec"].get("unschedulable")],
            "reports": reports,
            "beta_pods": [p["metadata"]["name"] for p in (await admin.list_objects(
                resource_path("", "v1", "pods", namespace=story.BETA)))["items"]],
            "raw_refusals": await raw_refusals(admin),
            "policies": sorted(p["metadata"]["name"] for p in (await admin.list_objects(
                f"{ADMISSION}/validatingadmissionpolicies"))["items"]),
            "bindings": sorted(b["metadata"]["name"] for b in (await admin.list_objects(
                f"{ADMISSION}/validatingadmissionpolicybindings"))["items"]),
            "settings": (await admin.get(resource_path(
                "", "v1", "configmaps", namespace=demo_module.CONTROLLER_NAMESPACE,
                name=keys.SETTINGS_CONFIGMAP)))["data"],
            "classes": sorted(c["metadata"]["name"] for c in (await admin.list_objects(story.class_path()))["items"]),
            "idle_events": [(e["type"], e["reason"], e["message"]) for e in (await admin.list_objects(
                resource_path("", "v1", "events", namespace=story.ACME),
                params={"fieldSelector": f"involvedObject.name={story.IDLE}"}))["items"]],
            **await dra_outcomes(admin),
        }


async def dra_outcomes(admin: Client) -> dict[str, Any]:
    """What step 8 left: the DRA order, its hold claim, the stopped VM, the scheduler's Events, the foreign pod."""
    infer = await admin.get(story.device_path(story.ACME, story.DRA_HELD))
    claim = await admin.get(story.dra_path("resourceclaims", story.ACME, story.DRA_HELD))
    vm = await admin.get(story.kubevirt_path("virtualmachines", story.ACME, story.DRA_VM))
    scheduled = (await admin.list_objects(resource_path("", "v1", "events", namespace=story.ACME), params={
        "fieldSelector": "reason=Scheduled"}))["items"]
    foreign = await admin.get(story.pods_path(story.LAB, story.CLAIM_POD))
    return {
        "infer": infer["status"],
        "infer_uid": infer["metadata"]["uid"],
        "infer_claim": claim,
        "dra_vm_running": vm["spec"]["running"],
        "scheduled": {e["involvedObject"]["name"]: (e.get("reportingComponent") or e["source"].get("component"),
                                                    e["message"]) for e in scheduled},
        "foreign": {"nodeName": foreign["spec"].get("nodeName"), "conditions": [
            (c["type"], c["status"], c.get("reason"), c.get("message")) for c in foreign["status"].get("conditions")
            or []]},
    }


ADMISSION = "/apis/admissionregistration.k8s.io/v1"


async def webhook_urls(plane: ControlPlane) -> list[str]:
    """The URL (scheme, host and port) of every webhook the API server calls."""
    async with plane.client() as admin:
        urls = []
        for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
            for config in (await admin.list_objects(f"{ADMISSION}/{kind}"))["items"]:
                urls += [w["clientConfig"]["url"].rsplit("/", 1)[0] for w in config["webhooks"]]
        return urls


async def raw_refusals(admin: Client) -> dict[str, str]:
    """What the API server answers now to step 6's raw pod and raw VMI (dry runs: nothing is left behind)."""
    answers = {}
    for kind, path, body in (
            ("pod", resource_path("", "v1", "pods", namespace=story.BETA), story.raw_pod_body(story.RAW_POD)),
            ("vmi", story.kubevirt_path("virtualmachineinstances", story.BETA), story.raw_vmi_body(story.RAW_VMI))):
        try:
            await admin.create(path, body, dry_run=True)
        except errors.ApiError as error:
            answers[kind] = error.message
        else:
            answers[kind] = "admitted"
    return answers


def check_story(stdout: str, outcomes: dict[str, Any]) -> None:
    steps = story_lines(stdout)
    assert sorted(steps, key=lambda head: int(head.rstrip("."))) == [f"{n}." for n in range(1, STEPS + 1)], stdout
    first = outcomes["train"]["nodeName"]
    # 1. bound; 7. moved off the node it was bound on, to the other H100 node, with an Event saying so.
    bound_on = steps["1."][1].split("Bound on ", 1)[1].split(" ", 1)[0]
    assert {bound_on, first} == {"gpu-1", "gpu-3"}
    assert outcomes["train"]["phase"] == "Bound"
    assert ("Bound", f"bound on node {bound_on}") in outcomes["events"]
    assert ("Moved", f"moved from node {bound_on} to node {first}: node {bound_on}: cordoned (spec.unschedulable)") \
        in outcomes["events"]
    assert f"moved to {first}" in steps["7."][1]
    assert outcomes["cordoned"] == [], "the story uncordons the node again"
    # 2. the order over the parent's budget was refused with the numbers, and nothing of it was created.
    assert "budget gpu.cozystack.io/h100 of tenant-acme: 1 allowed, 1 in use, order of 1 exceeds it by 1" \
        in steps["2."][1]
    assert outcomes["devices"] == {story.ACME: sorted([story.HELD, story.DRA_HELD]), story.BETA: []}
    # 3. the VM ran on the node holding its device: the launcher pod placed there by kube-scheduler, run by kwok.
    assert f"pinned to {bound_on} by the pod webhook" in steps["3."][1]
    assert f"VMI Running on {bound_on}" in steps["3."][1]
    # 4. stopped: no VMI, no launcher, the hold kept (and detached, so the cordon could move it).
    assert outcomes["vm_running"] is False
    assert outcomes["vmis"] == {story.ACME: [], story.BETA: []}
    assert outcomes["launchers"] == []
    assert "attachment" not in outcomes["train"]
    assert f"is still Bound on {bound_on}" in steps["4."][1]
    # 5. the other tenant's start that cannot fit: refused with the reason, no template device left behind.
    assert "class h100: at most 2 units free on one node" in steps["5."][1]
    assert "order of 3 exceeds it by 1" in steps["5."][1]
    # 6. a GPU by its raw name: the plain pod and the VMI without device references refused by the chart's
    # policies (published rawNames forbid), each with its reason, and neither created.
    assert outcomes["settings"][keys.SETTINGS_RAW_NAMES] == keys.RAW_NAMES_FORBID
    assert {"cozygpu-raw-gpu-names-pods", "cozygpu-raw-gpu-names-vmis"} <= set(outcomes["policies"])
    assert outcomes["bindings"] == outcomes["policies"], "each policy has its binding"
    pod_reason = (f"pod {story.BETA}/{story.RAW_POD} is refused: container compute requests {story.RAW_GPU}, "
                  "a GPU resource name, and raw GPU names are forbidden")
    vmi_reason = (f"VirtualMachineInstance {story.BETA}/{story.RAW_VMI} is refused: it asks for GPUs directly "
                  f"(gpus entry gpu1 ({story.RAW_GPU})) without the label {keys.DEVICE_REFS_LABEL}")
    assert "ValidatingAdmissionPolicy 'cozygpu-raw-gpu-names-pods'" in steps["6."][1]
    assert pod_reason in steps["6."][1]
    assert "ValidatingAdmissionPolicy 'cozygpu-raw-gpu-names-vmis'" in steps["6."][2]
    assert vmi_reason in steps["6."][2]
    assert pod_reason in outcomes["raw_refusals"]["pod"], "the API server refuses the raw pod now too"
    assert vmi_reason in outcomes["raw_refusals"]["vmi"]
    assert outcomes["beta_pods"] == []
    check_dra_step(steps["8."], outcomes)
    check_compaction_step(steps["9."], outcomes)
    check_ledger_step(steps["10."], outcomes)
    # 11. the catalog per tenant.
    assert any("cozygpu catalog -n tenant-beta" in line for line in steps["11."])


def check_compaction_step(lines: list[str], outcomes: dict[str, Any]) -> None:
    """Step 9: one GPU free on each H100 node; the order of two Bound after tenant-beta's stopped hold moved."""
    first, second = story.SPREAD
    assert f"{first} was Bound on " in lines[1]
    was, kept = lines[1].split(" was Bound on ", 1)[1].split(" and is released, ", 1)
    kept_on = kept.split(" is Bound on ", 1)[1]
    assert {was, kept_on} == {"gpu-1", "gpu-3"}, "one single-GPU hold on each H100 node"
    bound = lines[3].split("Bound on ", 1)[1].split(" ", 1)[0]
    assert bound == kept_on, "the order goes where the stopped hold it may move was"
    assert f"moved {story.BETA}'s stopped hold {second} to {was} first" in lines[3]
    assert (f"moved from node {kept_on} to node {was}: compaction: room made on node {kept_on} for GPUDevice "
            f"{story.BETA}/{story.PAIR} (2 units on one node; 1 stopped hold moved)") in lines[3]
    # tenant-acme-ml's stopped hold, on the other node, stayed: its namespace opted out (step 7's node, checked
    # with step 7), and tenant-beta's orders are gone again (``outcomes["devices"]``).


def check_ledger_step(lines: list[str], outcomes: dict[str, Any]) -> None:
    """Step 10: an idle hold of a class with an idleHoldLimit warned, then released, its budget taken by the order
    refused before; then ``cozygpu usage`` on the story's two stopped holds."""
    cls = story.EXPIRING_CLASS
    # The order takes the last GPU of tenant-acme's total budget: one more is refused, with the numbers.
    node = lines[1].split("Bound on ", 1)[1].split(" ", 1)[0]
    assert node in {"gpu-1", "gpu-3"}, "the class sells the H100s"
    assert (f"GPUDevice {story.ACME}/{story.NEXT}: budget {keys.QUOTA_TOTAL} of {story.USAGE_TENANT}: 3 allowed, "
            "3 in use, order of 1 exceeds it by 1") in lines[1]
    # Warned (the condition, and its Event) with the time of the release, idleHoldLimit after idleSince.
    warning = lines[2].split(" after the order: ", 1)[1]
    assert lines[2].startswith(f"   {EXPIRING_CONDITION} (reason IdleHoldLimit) ")
    assert warning.startswith("idle since ")
    assert (f": its 1 unit will be released at {release_time(warning)} (class {cls}'s idleHoldLimit "
            f"{story.IDLE_HOLD_LIMIT}); start its VM before then to keep them") in warning
    assert ("Warning", EXPIRING_CONDITION, warning) in outcomes["idle_events"]
    # Released: no node, the Bound condition False with reason IdleHoldExpired (and its Event), the budget free.
    assert lines[3].startswith("   Released ")
    assert f" after the order, on no node; its Bound condition False, reason {REASON_EXPIRED}: released after " \
        in lines[3]
    released = lines[3].split(f"reason {REASON_EXPIRED}: ", 1)[1]
    assert (f"idle (class {cls}'s idleHoldLimit {story.IDLE_HOLD_LIMIT}): its 1 unit on node {node} are free and "
            "its budget is no longer used; order again to hold GPUs") in released
    assert ("Warning", REASON_EXPIRED, released) in outcomes["idle_events"]
    assert f"free again: gpudevice/{story.NEXT} accepted and Bound on gpu-" in lines[4]
    assert f"class {cls} withdrawn again" in lines[5]
    assert cls not in outcomes["classes"], "the step deletes its class"
    # cozygpu usage -n tenant-acme --subtree: the command's table, one row per class of the two stopped holds.
    assert f"cozygpu usage -n {story.USAGE_TENANT} --subtree" in lines[6]
    assert lines[7].split() == ["NAMESPACE", "CLASS", "HELD", "RUNNING", "IDLE", "GPU-HOURS", "HELD", "GPU-HOURS",
                                "IDLE", "IDLE", "SHARE"]
    rows = [line.split() for line in lines[8:10]]
    assert [row[:5] for row in rows] == [[story.ACME, "h100", "1", "0", "1"], [story.ACME, story.DRA_CLASS, "1", "0",
                                                                               "1"]]
    for row in rows:
        assert float(row[5]) >= float(row[6]) >= 0, row
        assert row[7].endswith("%"), row
    assert lines[10].startswith(f"   2 GPUs held, 0 running, 2 idle now ({story.HELD}'s VM stopped in step 4"), \
        lines[10]
    hours = lines[10].split("since each hold began ", 1)[1].split(" ")
    assert hours[1:3] == ["GPU-hours", "held"]
    assert float(hours[0]) > 0, "the holds were held through the expiry's 20 s"


def release_time(warning: str) -> str:
    """The release time an IdleHoldExpiring message must name: its idleSince plus the class's idleHoldLimit."""
    since = datetime.fromisoformat(warning.removeprefix("idle since ").split(": ", 1)[0].replace("Z", "+00:00"))
    at = since + timedelta(seconds=parse_duration(story.IDLE_HOLD_LIMIT))
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def check_dra_step(lines: list[str], outcomes: dict[str, Any]) -> None:
    """Step 8: a GPU of the DRA class held as a ResourceClaim, its VM started and stopped, a foreign claim refused."""
    node = demo_module.DRA_NODE.name
    held = [f"{dra_driver.DRIVER}/{node}/{dra_driver.device_name(0)}"]
    # The order: Bound on the DRA node, held by the claim named after it, allocated there by the binder.
    assert (outcomes["infer"]["phase"], outcomes["infer"]["nodeName"]) == ("Bound", node)
    assert "attachment" not in outcomes["infer"], "the stopped VM's device is detached"
    assert f"Bound on {node}; resourceclaim/{story.DRA_HELD} allocated {held[0]}, reserved for " \
           f"gpudevices/{story.DRA_HELD}," in lines[1]
    # Started: the VMI got the claim and a gpus entry naming it; the launcher, not pinned, was placed on the DRA
    # node by kube-scheduler (its Event), which reserved the claim for it beside the device.
    ran = lines[3]
    assert f"gave the VMI the claim ({story.DRA_HELD}) and 1 GPU (claim {story.DRA_HELD}, request gpu-0)" in ran
    pod = ran.split("the launcher pod ", 1)[1].split(",", 1)[0]
    assert pod.startswith(f"virt-launcher-{story.DRA_VM}-"), ran
    assert f"{pod}, not pinned, was placed on {node} by kube-scheduler" in ran
    assert f"the claim reserved for gpudevices/{story.DRA_HELD}, pods/{pod}: VMI Running on {node}" in ran
    assert outcomes["scheduled"][pod] == ("default-scheduler", f"Successfully assigned {story.ACME}/{pod} to {node}")
    # Stopped: no VMI, no launcher, and the claim still allocated on the DRA node, reserved for the device alone.
    assert outcomes["dra_vm_running"] is False
    claim = outcomes["infer_claim"]
    assert story.allocated(claim) == held
    assert claim["status"]["reservedFor"] == [{"apiGroup": keys.GROUP, "resource": keys.GPUDEVICE_PLURAL,
                                               "name": story.DRA_HELD, "uid": outcomes["infer_uid"]}]
    assert [(o["kind"], o["name"]) for o in claim["metadata"]["ownerReferences"]] == [
        (keys.GPUDEVICE_KIND, story.DRA_HELD)]
    assert f"resourceclaim/{story.DRA_HELD} is still allocated {held[0]}, reserved for gpudevices/{story.DRA_HELD}:" \
        in lines[5]
    # A plain pod with a claim of its own of the DeviceClass, on that node, outside every tenant: unschedulable.
    foreign = outcomes["foreign"]
    assert foreign["nodeName"] is None
    [(reason, message)] = [(r, m) for kind, status, r, m in foreign["conditions"]
                           if kind == "PodScheduled" and status == "False"]
    assert reason == "Unschedulable"
    assert "1 cannot allocate all claims" in message
    assert "Unschedulable after " in lines[7]
    assert "cannot allocate all claims" in lines[7]


def test_the_demo_tells_the_story_through_the_api_server_and_can_be_told_again(
    full_plane: ControlPlane, tmp_path: Path
) -> None:
    # `full_plane` proves the binaries exist (or fails under CI); the demo gets a full plane of its own.
    directory = tmp_path / "cluster"
    assert cozygpu("cluster", "start", "--dir", str(directory)).returncode == 0
    demo_plane = ControlPlane.attach(directory)
    try:
        demo = cozygpu("cluster", "demo", "--dir", str(directory))
        print(demo.stdout)
        assert demo.returncode == 0, demo.stderr
        assert "gpu-1: 2 GPU functions, 2 allocatable" in demo.stdout
        assert "gpu-2: 2 GPU functions, 5 allocatable" in demo.stdout
        assert f"{demo_module.DRA_NODE.name}: 1 vfio GPU published by the simulated NVIDIA DRA driver" in demo.stdout
        published = json.loads(demo.stdout.split("cozy-gpu/cozygpu-settings: ", 1)[1].splitlines()[0])
        assert published["gpuEnabled"] == "true"
        assert json.loads(published["resourceNames"]) == [
            f"deviceclass.resource.kubernetes.io/{dra_driver.DEVICE_CLASS}", "nvidia.com/GH100_H100_SXM5_80GB",
            "nvidia.com/GRID_T4-1Q", "nvidia.com/GRID_T4-2Q"]
        check_story(demo.stdout, asyncio.run(api_outcomes(demo_plane)))
        assert published["rawNames"] == "forbid"
        background = {name: int((directory / f"{name}.pid").read_text()) for name in demo_module.BACKGROUND}
        for pid in background.values():
            os.kill(pid, 0)  # still running after the demo returned
        # The webhooks call the balancer, which has both replicas among its endpoints.
        balancer = replicas.read_state(directory)
        assert balancer is not None
        assert [e["ready"] for e in balancer["balancer"]["endpoints"]] == [True, True]
        assert set(asyncio.run(webhook_urls(demo_plane))) == {f"https://{balancer['balancer']['address']}"}
        assert sorted(demo_plane.components) == ["kube-controller-manager", "kube-scheduler", "kwok"]

        answer = cozygpu("catalog", "-n", "tenant-acme", "--count", "1", "-o", "json",
                         "--kubeconfig", str(directory / "kubeconfig"))
        assert answer.returncode == 0, answer.stderr
        by_class = {row["class"]: row for row in json.loads(answer.stdout)["classes"]}
        # The held device counts against the parent's budget (R-MOD-2), with the numbers.
        assert by_class["h100"]["reason"] == "BudgetExceeded"
        assert "gpu.cozystack.io/h100 of tenant-acme: 1 allowed, 1 in use" in by_class["h100"]["message"]
        assert by_class["h100"]["freeInCluster"] == 3
        beta = json.loads(cozygpu("catalog", "-n", "tenant-beta", "-o", "json",
                                  "--kubeconfig", str(directory / "kubeconfig")).stdout)
        assert {row["class"]: row["reason"] for row in beta["classes"]} == {
            "h100": None, story.DRA_CLASS: None, "t4-1q": "NotEntitled"}
        assert by_class[story.DRA_CLASS]["freeInCluster"] == 0, "its one GPU is held for the stopped VM"

        again = cozygpu("cluster", "demo", "--dir", str(directory))
        assert again.returncode == 0, again.stderr
        assert f"cleared what an earlier run left: vm/{story.DRA_VM} -n {story.ACME}, vm/{story.VM} -n {story.ACME}, " \
               f"gpudevice/{story.DRA_HELD} -n {story.ACME}, gpudevice/{story.HELD} -n {story.ACME}, " \
               f"pod/{story.CLAIM_POD} -n {story.LAB}, resourceclaimtemplate/{story.CLAIM_TEMPLATE} -n {story.LAB}" \
               in again.stdout
        check_story(again.stdout, asyncio.run(api_outcomes(demo_plane)))
        for name, pid in background.items():
            assert gone(pid), f"the second demo left the first one's {name} running"
        background = {name: int((directory / f"{name}.pid").read_text()) for name in demo_module.BACKGROUND}
    finally:
        stopped = cozygpu("cluster", "stop", "--dir", str(directory))
    assert stopped.returncode == 0, stopped.stderr
    for name, pid in background.items():
        assert gone(pid), f"cozygpu cluster stop left {name} running"
    for name, (pid, _) in demo_plane.components.items():
        assert gone(pid), f"cozygpu cluster stop left {name} running"


def test_the_demo_refuses_an_api_only_plane_with_a_clear_line(plane: ControlPlane, tmp_path: Path) -> None:
    directory = tmp_path / "fast"
    assert cozygpu("cluster", "start", "--api-only", "--dir", str(directory)).returncode == 0
    try:
        demo = cozygpu("cluster", "demo", "--dir", str(directory))
        assert demo.returncode == 1
        assert "the demo needs the full plane" in demo.stderr
        assert "Traceback" not in demo.stderr
    finally:
        cozygpu("cluster", "stop", "--dir", str(directory))
