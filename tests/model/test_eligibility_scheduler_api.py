"""The model's node eligibility for a VMI's launcher agrees with the real kube-scheduler.

For every VMI shape below (required node affinity with every operator and
``matchFields``, nodeSelector, tolerations) and every simulated node, a pod
carrying what the launcher pod would carry, pinned to that one node by its
hostname label, is given to kube-scheduler. The nodes it binds are exactly the
nodes ``node_problem`` finds no problem with, read through the cache's own
conversions (``vmi_view``, ``node_view``). A node the scheduler refuses and the
model accepts is the bug this test exists to catch (and the other way round).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from cozygpu.devcluster import nodes
from cozygpu.kube import Client, resource_path
from cozygpu.model.eligibility import node_problem
from cozygpu.views.decode import node_view
from cozygpu.views.decode_pods import vmi_view
from tests.support.planes import Fleet

NAMESPACES = resource_path("", "v1", "namespaces")
TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
TOLERATE = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def name_is(operator: str, node: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": operator, "values": [node]}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def shapes(names: list[str]) -> dict[str, dict[str, Any]]:
    """VMI specs (the parts the launcher pod copies), by a name for the failure message."""
    first, second = names[0], names[1]
    return {
        "In": {"affinity": affinity({"matchExpressions": [expr("zone", "In", "a")]})},
        "NotIn": {"affinity": affinity({"matchExpressions": [expr("zone", "NotIn", "a")]})},
        "NotIn on an absent label": {"affinity": affinity({"matchExpressions": [expr("rack", "NotIn", "r1")]})},
        "Exists": {"affinity": affinity({"matchExpressions": [expr("gen", "Exists")]})},
        "DoesNotExist": {"affinity": affinity({"matchExpressions": [expr("gen", "DoesNotExist")]})},
        "Gt": {"affinity": affinity({"matchExpressions": [expr("gen", "Gt", "4")]})},
        "Lt": {"affinity": affinity({"matchExpressions": [expr("gen", "Lt", "6")]})},
        "matchFields In": {"affinity": affinity({"matchFields": [name_is("In", first)]})},
        "matchFields NotIn": {"affinity": affinity({"matchFields": [name_is("NotIn", second)]})},
        "terms ORed": {"affinity": affinity({"matchExpressions": [expr("zone", "In", "b")]},
                                            {"matchFields": [name_is("In", first)]})},
        "requirements ANDed": {"affinity": affinity({"matchExpressions": [expr("zone", "In", "a"),
                                                                          expr("gen", "Gt", "4")]})},
        "labels and fields ANDed": {"affinity": affinity({"matchExpressions": [expr("zone", "In", "a")],
                                                          "matchFields": [name_is("NotIn", first)]})},
        "nodeSelector with affinity": {"nodeSelector": {"zone": "c"},
                                       "affinity": affinity({"matchExpressions": [expr("gen", "DoesNotExist")]})},
        "tolerations with affinity": {"tolerations": TOLERATE,
                                      "affinity": affinity({"matchExpressions": [expr("zone", "In", "a")]})},
        "no affinity": {},
    }


def launcher_like(name: str, shape: dict[str, Any], node: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "compute", "image": "cozygpu.invalid/compute"}],
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {**shape.get("nodeSelector", {}), "kubernetes.io/hostname": node},
    }
    for key in ("affinity", "tolerations"):
        if key in shape:
            spec[key] = shape[key]
    return {"metadata": {"name": name, "labels": {"shape": "x"}}, "spec": spec}


async def scheduler_verdicts(admin: Client, pods: str, wanted: dict[str, tuple[str, str]]) -> dict[str, bool]:
    """Each pod's fate: True once bound, False once the scheduler marks it Unschedulable."""
    verdicts: dict[str, bool] = {}
    async with asyncio.timeout(60):
        while len(verdicts) < len(wanted):
            for pod in (await admin.list_objects(pods))["items"]:
                name = pod["metadata"]["name"]
                if name in verdicts or name not in wanted:
                    continue
                if pod["spec"].get("nodeName"):
                    verdicts[name] = True
                conditions = pod.get("status", {}).get("conditions") or []
                if any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions):
                    verdicts[name] = False
            await asyncio.sleep(0.2)
    return verdicts


async def test_the_model_and_kube_scheduler_accept_the_same_nodes_for_a_launcher(
    full_admin: Client, fleet: Fleet
) -> None:
    tag = uuid.uuid4().hex[:6]
    simulated = [
        nodes.SimNode(f"elig-{tag}-0", labels={"zone": "a", "gen": "3"}),
        nodes.SimNode(f"elig-{tag}-1", labels={"zone": "b", "gen": "5"}),
        nodes.SimNode(f"elig-{tag}-2", labels={"zone": "c"}),
        nodes.SimNode(f"elig-{tag}-3", labels={"zone": "a", "gen": "7"}, taints=[TAINT]),
    ]
    names = await fleet(*simulated)
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    await full_admin.create(NAMESPACES, {"metadata": {"name": namespace}})
    pods = resource_path("", "v1", "pods", namespace=namespace)

    wanted: dict[str, tuple[str, str]] = {}
    all_shapes = shapes(names)
    for s, (label, shape) in enumerate(all_shapes.items()):
        for n, node in enumerate(names):
            pod_name = f"s{s}-n{n}"
            wanted[pod_name] = (label, node)
            await full_admin.create(pods, launcher_like(pod_name, shape, node))
    scheduled = await scheduler_verdicts(full_admin, pods, wanted)

    node_views = {name: node_view(await full_admin.get(f"/api/v1/nodes/{name}")) for name in names}
    disagreements = []
    for pod_name, (label, node) in sorted(wanted.items()):
        vmi = vmi_view({"metadata": {"namespace": namespace, "name": "vm"}, "spec": all_shapes[label]})
        problem = node_problem(node_views[node], node_name=node, tolerations=vmi.tolerations,
                               node_selector=vmi.node_selector, node_affinity=vmi.node_affinity)
        model = problem is None
        if model != scheduled[pod_name]:
            why = problem.message if problem else "no problem"
            disagreements.append(f"{label} on {node}: scheduler {scheduled[pod_name]}, model {model} ({why})")
    assert not disagreements, "\n".join(disagreements)
    # The table is not trivially all-yes or all-no: every shape but the plain one refuses some node.
    refused = {wanted[p][0] for p, ok in scheduled.items() if not ok}
    assert refused >= set(all_shapes) - {"no affinity"}
