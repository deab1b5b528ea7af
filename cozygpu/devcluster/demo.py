"""``cozygpu cluster demo``: a small GPU platform on the local control plane, and its story.

What it sets up, all through the real code paths where they can run here,
each long-running part a background process (pid in ``DIR/<name>.pid``, log in
``DIR/logs/<name>.log``; ``cozygpu cluster stop`` and the next demo end them):

- ``simnodes``: three simulated GPU nodes (``cozygpu.devcluster.simnodes``) —
  two HGX boards with two H100s on vfio-pci and a T4 with five vGPU (mdev)
  instances of two profiles — each a kwok-managed Node (Ready, its
  allocatable what the device plugins report), a sysfs tree and a kubelet
  pod-resources socket, read by the **real agent**, which keeps the GPUNode
  reports fresh;
- ``gpu-dra``: a kwok node whose one vfio GPU the simulated NVIDIA DRA driver
  publishes (``cozygpu.devcluster.dra_driver``: the DeviceClass
  ``vfio.gpu.nvidia.com``, a ResourceSlice); no agent reports it: a DRA
  class's units come from the slices;
- three GPU offers (GPUClass: ``h100`` and ``t4-1q`` from device plugins,
  ``h100-dra`` from the DRA driver's DeviceClass), Cozystack tenant namespaces
  with GPU budgets and the vGPU entitlement, and ``gpu-lab``, a namespace of
  no tenant (step 8's plain pod); the KubeVirt VM and VMI CRDs;
- ``controller-a`` and ``controller-b``: two replicas of the **controller**
  with GPU enabled and raw GPU names forbidden (``--raw-gpu-names forbid``),
  acting as the chart's controller service account with the chart's RBAC
  (``controller_identity``): the raw-claims policy lets that caller alone
  create a claim of a sold DeviceClass in a tenant namespace (the DRA holds);
  one wins the lease and runs the binder and the settings publisher (which
  publishes ``rawNames: forbid``), both warm their caches and serve the
  webhooks. They are the children of ``replicas`` (``cozygpu.devcluster.replicas``),
  which starts a replica that ends again (kubelet's part) and runs the
  loopback balancer in front of both (``cozygpu.devcluster.balancer``,
  kube-proxy's part: each connection to a replica that passes its readiness probe);
- the webhook configurations of the chart, registered by URL at the balancer
  with the plane's serving CA (``register_webhooks``), as the chart registers
  them at its Service;
- the chart's admission policies and their bindings, rendered by helm
  from ``manifests/`` (``chart.render``, against what the API server serves)
  and applied as they are (``install_policies``);
- ``kubevirt``: the KubeVirt stand-in (VM → VMI → launcher pod), acting as
  kubevirt-controller's service account (the chart's ``kubevirt`` values), the
  one caller the raw-name pod policy lets create a launcher pod with GPUs;
- then the story (``story.py``; step 10 offers a class of its own with a short ``idleHoldLimit`` and
  withdraws it again) and the catalog each tenant sees.

A run clears what an earlier run left (``story.clear``), so it can be run again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import yaml

from cozygpu import keys
from cozygpu.admission.webhooks import configurations
from cozygpu.commands.catalog import catalog_row, read_snapshot, render_table
from cozygpu.devcluster import apply, background, chart, dra_driver, nodes, pki, prometheus, replicas, simnodes, story
from cozygpu.devcluster.plane import ControlPlane, alive, free_port, terminate
from cozygpu.kube import Client, errors, resource_path
from cozygpu.model.catalog import catalog


class DemoError(Exception):
    """The platform did not come up; the message says which part and where its log is."""

CONTROLLER_NAMESPACE = "cozy-gpu"
#: The webhooks' timeoutSeconds and the replicas' --webhook-timeout (their --bind-wait stays 10 s).
WEBHOOK_TIMEOUT = 15
HOSTER_NAMES = ("nvidia.com/GH100_H100_SXM5_80GB",)
#: The controllers' --raw-gpu-names: a GPU reaches a workload only through a GPUDevice (R-ADM-5, R-POL-1).
RAW_NAMES = keys.RAW_NAMES_FORBID
#: The chart's values the demo renders its admission policies with (the rest are the chart's defaults).
CHART_VALUES: dict[str, Any] = {"gpu": {"enabled": True, "rawNames": RAW_NAMES, "resourceNames": list(HOSTER_NAMES)}}
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy",
                "MutatingAdmissionPolicyBinding")
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def _gpu_class(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND, "metadata": {"name": name},
            "spec": {"source": {"devicePlugin": {}}, **spec}}


CLASSES = [
    _gpu_class("h100", vendor="NVIDIA", model="H100 SXM5 80GB", mode="Passthrough", memory="80Gi",
               resourceName="nvidia.com/GH100_H100_SXM5_80GB"),
    _gpu_class("t4-1q", vendor="NVIDIA", model="T4", mode="VGPU", profile="GRID T4-1Q", memory="1Gi",
               resourceName="nvidia.com/GRID_T4-1Q"),
    # SPEC §1.5: the DeviceClass's GPUs, its resourceName the DeviceClass's implicit extended resource name.
    _gpu_class(story.DRA_CLASS, vendor="NVIDIA", model="H100 SXM5 80GB", mode="Passthrough", memory="80Gi",
               resourceName=f"deviceclass.resource.kubernetes.io/{dra_driver.DEVICE_CLASS}",
               source={"dra": {"deviceClassName": dra_driver.DEVICE_CLASS}}),
]
#: The kwok node whose vfio GPUs the simulated DRA driver publishes, and how many.
DRA_NODE = nodes.SimNode("gpu-dra")
DRA_GPUS = 1

#: namespace -> (labels, GPU budgets in its tenant-quota)
TENANTS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "tenant-root": ({keys.TENANT_NAMESPACE_LABEL: "cozystack.local"}, {}),
    "tenant-acme": ({keys.TENANT_NAMESPACE_LABEL: "", keys.VGPU_ENTITLED_LABEL: keys.VGPU_ENTITLED_VALUE},
                    {f"requests.{keys.class_quota_key('h100')}": "1", f"requests.{keys.QUOTA_TOTAL}": "3"}),
    "tenant-acme-ml": ({keys.TENANT_NAMESPACE_LABEL: ""}, {}),
    "tenant-beta": ({keys.TENANT_NAMESPACE_LABEL: ""}, {f"requests.{keys.QUOTA_TOTAL}": "4"}),
}


async def _ensure(client: Client, path: str, body: dict[str, Any]) -> None:
    with contextlib.suppress(errors.AlreadyExists):
        await client.create(path, body)


async def _tenants(admin: Client) -> None:
    await _ensure(admin, resource_path("", "v1", "namespaces"), {"metadata": {"name": story.LAB}})
    for name, (labels, budgets) in TENANTS.items():
        await _ensure(admin, resource_path("", "v1", "namespaces"), {"metadata": {"name": name, "labels": labels}})
        if budgets:
            await _ensure(admin, resource_path("", "v1", "resourcequotas", namespace=name),
                          {"metadata": {"name": keys.TENANT_QUOTA_NAME}, "spec": {"hard": budgets}})


async def dra_node(admin: Client) -> str:
    """``DRA_NODE`` (kept when an earlier run made it), Ready, with its vfio GPUs published by the simulated driver."""
    if await admin.get_or_none(resource_path("", "v1", "nodes", name=DRA_NODE.name)) is None:
        await nodes.add_nodes(admin, [DRA_NODE])
    await nodes.wait_ready(admin, [DRA_NODE.name])
    await dra_driver.publish(admin, {DRA_NODE.name: DRA_GPUS})
    return DRA_NODE.name


def start_simnodes(plane: ControlPlane) -> int:
    """The simulated GPU nodes and their agents (``cozygpu.devcluster.simnodes``) in the background."""
    proc = _background(plane, "simnodes", [sys.executable, "-m", "cozygpu.devcluster.simnodes",
                                           "--dir", str(plane.directory)])
    return proc.pid


async def _reports(admin: Client, since: datetime.datetime) -> list[dict[str, Any]]:
    """The GPUNode statuses of the demo's nodes, once each agent has reported after ``since``."""
    names = [name for name, _ in simnodes.DEMO_NODES]

    async def fresh() -> list[dict[str, Any]] | None:
        found = []
        for name in names:
            node = await admin.get_or_none(resource_path(keys.GROUP, keys.VERSION, keys.GPUNODE_PLURAL, name=name))
            status = (node or {}).get("status") or {}
            stamp = ((status.get("agent") or {}).get("lastReport")) or ""
            if not stamp or datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")) < since:
                return None
            found.append(status)
        return found

    statuses, _ = await story.until(fresh, "every simulated node's agent reporting", time.monotonic())
    return statuses


@attrs.frozen
class Replica:
    """A controller replica the demo runs in the background (pid in ``DIR/<name>.pid``, as last started)."""

    name: str
    pid: int
    health: int
    webhook: int


#: The controller replicas, children of the ``replicas`` supervisor.
REPLICAS = ("controller-a", "controller-b")
#: The background processes the demo starts, in the order ``cozygpu cluster stop`` (and the next demo) ends
#: them: the supervisor first, so that it starts no replica again, then anything it left.
BACKGROUND = ("replicas", *REPLICAS, "kubevirt", "simnodes")
#: Where the balancer in front of the replicas listens (a loopback address, as everything of the plane).
BALANCER_HOST = "127.0.0.1"
#: How long ``cozygpu cluster stop`` waits for the supervisor: its replicas have 30 s of grace each.
SUPERVISOR_STOP = replicas.GRACE + 10


def _background(plane: ControlPlane, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    return background.spawn(argv, log=plane.directory / "logs" / f"{name}.log",
                            pid_file=plane.directory / f"{name}.pid")


def serving_certs(plane: ControlPlane, host: str = BALANCER_HOST) -> Path:
    """The webhook serving certificate, signed by the plane's serving CA (which the API server trusts).

    Valid for ``host``, the balancer's address the API server calls (TLS
    passes through it to the replicas), as the chart's certificate names its
    Service; and for 127.0.0.1, where each replica also listens.
    """
    certs = plane.directory / "webhook-certs"
    certs.mkdir(exist_ok=True)
    serving_ca = pki.KeyPair(plane.pki_dir / "serving-ca.crt", plane.pki_dir / "serving-ca.key")
    hosts = tuple(dict.fromkeys((host, "127.0.0.1", "localhost")))
    pki.issue(serving_ca, certs, "tls", common_name="cozygpu-webhook", hosts=hosts, server=True)
    return certs


def controller_user() -> tuple[str, str]:
    """(service account, user name) of the controller, as the chart's values name it."""
    account = str(yaml.safe_load((apply.chart_dir() / "values.yaml").read_text())["serviceAccounts"]["controller"])
    return account, f"system:serviceaccount:{CONTROLLER_NAMESPACE}:{account}"


def controller_kubeconfig(plane: ControlPlane) -> Path:
    return plane.directory / "controller.kubeconfig"


async def controller_identity(admin: Client, plane: ControlPlane, rendered: list[dict[str, Any]]) -> None:
    """The controller's service account and RBAC as the chart renders them, applied, and a kubeconfig acting as it.

    A client certificate of the service account's user name and groups (from the
    plane's client CA) stands in for its token: the policies that exempt the
    controller (the raw-claims policy lets it alone create a hold claim of a sold
    DeviceClass in a tenant namespace) see the replicas as the chart's controller,
    and the API server grants them what the chart grants it, no more.
    """
    account, user = controller_user()
    objects = [obj for obj in rendered if obj["kind"] in RBAC_KINDS and obj["metadata"]["name"] == account]
    await apply.apply_objects(admin, objects, namespace=CONTROLLER_NAMESPACE)
    identity = plane.identity(user, ("system:serviceaccounts", f"system:serviceaccounts:{CONTROLLER_NAMESPACE}"))
    path = controller_kubeconfig(plane)
    path.write_text(yaml.safe_dump(plane.kubeconfig_for(identity, name="cozygpu-controller")))
    path.chmod(0o600)


def controller_argv(plane: ControlPlane, name: str, certs: Path, health: int, webhook: int) -> list[str]:
    """A controller replica's command line: GPU on, webhooks served, raw GPU names forbidden, as the controller.
    The supervisor adds its HTTPS metrics address and certificate (``replicas``)."""
    return [sys.executable, "-m", "cozygpu", "controller", "--kubeconfig", str(controller_kubeconfig(plane)),
            "--namespace", CONTROLLER_NAMESPACE, "--health-addr", f"127.0.0.1:{health}", "--identity", name,
            "--gpu-resource-names", ",".join(HOSTER_NAMES), "--raw-gpu-names", RAW_NAMES, "--log-format", "text",
            "--enable-gpu", "--cert-dir", str(certs), "--webhook-addr", f"127.0.0.1:{webhook}",
            "--webhook-timeout", f"{WEBHOOK_TIMEOUT}s"]


def distinct_ports(count: int) -> list[int]:
    """``count`` free loopback ports, no two the same (``free_port`` picks at random and binds nothing)."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def start_replicas(plane: ControlPlane, certs: Path, timeout: float = 60.0) -> tuple[replicas.Spec, list[Replica]]:
    """The replicas and the balancer in front of them (``replicas``, in the background), once both are endpoints."""
    # Every port the platform listens on, picked here and distinct: a port picked free is free only until
    # someone binds it, and the supervisor binds the balancer's only once it runs (a metrics port it picked
    # itself once took the balancer's, and that replica never started).
    ports = distinct_ports(3 * len(REPLICAS) + 1)
    members = []
    for name in REPLICAS:
        health, webhook, metrics = ports.pop(), ports.pop(), ports.pop()
        members.append(replicas.ReplicaSpec(name, tuple(controller_argv(plane, name, certs, health, webhook)),
                                            health, webhook, metrics=metrics))
    spec = replicas.Spec(BALANCER_HOST, ports.pop(), tuple(members))
    replicas.write_spec(plane.directory, spec)
    with contextlib.suppress(FileNotFoundError):
        (plane.directory / replicas.STATE_FILE).unlink()
    proc = _background(plane, "replicas", [sys.executable, "-m", replicas.PROGRAM, "--dir", str(plane.directory)])
    logs = plane.directory / "logs"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoError(f"the replicas' supervisor exited with code {proc.returncode}; see {logs / 'replicas.log'}")
        state = replicas.read_state(plane.directory)
        if state is not None and all(e["ready"] for e in state["balancer"]["endpoints"]):
            pids = {r["name"]: r["pid"] for r in state["replicas"]}
            prometheus.scrape_replicas(plane.directory)  # the targets of the plane's Prometheus, if it runs one
            return spec, [Replica(m.name, pids[m.name], m.health, m.webhook) for m in members]
        time.sleep(0.1)  # another process writes it: polled
    raise DemoError(f"the controller replicas were not both ready within {timeout:.0f} s; see "
                    f"{', '.join(str(logs / f'{name}.log') for name in REPLICAS)} and {logs / 'replicas.log'}")


def kubevirt_controller() -> tuple[str, str, str]:
    """(namespace, service account, user name) of kubevirt-controller, as the chart's values name it."""
    values = yaml.safe_load((apply.chart_dir() / "values.yaml").read_text())["kubevirt"]
    namespace, account = str(values["namespace"]), str(values["controllerServiceAccount"])
    return namespace, account, f"system:serviceaccount:{namespace}:{account}"


async def kubevirt_identity(admin: Client) -> None:
    """kubevirt-controller's namespace, service account and the RBAC the stand-in needs (what virt-operator grants)."""
    namespace, account, _ = kubevirt_controller()
    name = "cozygpu-demo-kubevirt-controller"
    await apply.apply_objects(admin, [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": [
             {"apiGroups": ["kubevirt.io"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
              "resources": ["virtualmachines", "virtualmachineinstances", "virtualmachineinstances/status"]},
             {"apiGroups": [""], "resources": ["pods"],
              "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
             # Its informers start a kind once its CRD is served (lazy kinds).
             {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
              "verbs": ["get", "list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "namespace": namespace, "name": account}]},
    ])


def start_kubevirt(plane: ControlPlane) -> int:
    """The KubeVirt stand-in (``cozygpu.devcluster.kubevirt``) in the background: VM → VMI → launcher pod.

    It acts as kubevirt-controller's service account (a client certificate of
    that user name and the service-account groups, from the plane's client
    CA), so the raw-name pod policy sees its launcher pods as KubeVirt's.
    """
    namespace, _, user = kubevirt_controller()
    proc = _background(plane, "kubevirt", [sys.executable, "-m", "cozygpu.devcluster.kubevirt",
                                           "--dir", str(plane.directory), "--user", user,
                                           "--group", "system:serviceaccounts",
                                           "--group", f"system:serviceaccounts:{namespace}"])
    time.sleep(0.2)
    if proc.poll() is not None:
        raise DemoError(f"the KubeVirt stand-in exited with code {proc.returncode}; "
                        f"see {plane.directory / 'logs' / 'kubevirt.log'}")
    return proc.pid


async def _settings(admin: Client) -> dict[str, str]:
    """The settings ConfigMap once this run's leader has published it (``rawNames`` as the replicas were told)."""
    path = resource_path("", "v1", "configmaps", namespace=CONTROLLER_NAMESPACE, name=keys.SETTINGS_CONFIGMAP)

    async def published() -> dict[str, str] | None:
        found = await admin.get_or_none(path)  # written by another process: polled
        data: dict[str, str] = (found or {}).get("data") or {}
        return data if data.get(keys.SETTINGS_RAW_NAMES) == RAW_NAMES else None

    data, _ = await story.until(published, f"the leader publishing {keys.SETTINGS_CONFIGMAP} with rawNames "
                                           f"{RAW_NAMES}", time.monotonic(), timeout=30)
    return data


async def register_webhooks(admin: Client, plane: ControlPlane, url: str, rendered: list[dict[str, Any]]) -> None:
    """The chart's webhook configurations, calling ``url`` (the balancer) with the plane's serving CA.

    In a cluster the webhooks call the chart's Service, in front of every
    ready replica; here they call the balancer, which plays that part on
    loopback (``cozygpu.devcluster.balancer``). Where the chart (``rendered``)
    gives the finalizer by a MutatingAdmissionPolicy, the finalizer hook is
    left out, as the chart leaves it out.
    """
    ca = base64.b64encode(plane.ca_file.read_bytes()).decode()
    by_policy = any(obj["kind"] == "MutatingAdmissionPolicy" for obj in rendered)
    for body in configurations(url, ca, timeout_seconds=WEBHOOK_TIMEOUT, finalizer_hook=not by_policy):
        plural = body["kind"].lower() + "s"
        path = resource_path("admissionregistration.k8s.io", "v1", plural)
        with contextlib.suppress(errors.NotFound):
            await admin.delete(f"{path}/{body['metadata']['name']}")
        await admin.create(path, body)
    # The API server loads webhook configurations asynchronously: wait until a dry-run order reaches ours.
    probe = story.order("demo-probe", "no-such-class", 1)
    async with asyncio.timeout(30):
        while True:
            try:
                await admin.create(story.device_path("tenant-root"), probe, dry_run=True)
            except errors.ApiError as error:
                if "no-such-class does not exist" in error.message:
                    return
                raise
            await asyncio.sleep(0.1)


async def render_chart(admin: Client, plane: ControlPlane) -> list[dict[str, Any]]:
    """The chart as ``helm install`` would render it here: by helm from ``manifests/`` (``chart.render``) with
    ``CHART_VALUES`` against what this API server serves (so the VMI policy renders: the KubeVirt CRDs are
    installed first)."""
    served = await chart.served_api_versions(admin)
    return await asyncio.to_thread(chart.render, CHART_VALUES, api_versions=served, kube_version=plane.minor,
                                   namespace=CONTROLLER_NAMESPACE)


async def install_policies(admin: Client, rendered: list[dict[str, Any]]) -> list[str]:
    """The chart's admission policies and bindings (of ``render_chart``), applied.

    Only the policies and their bindings are applied (the controllers run as
    processes, not from the chart's Deployment; their RBAC is applied by
    ``controller_identity``). Returns once both raw-name policies refuse a dry
    run: a binding is enforced a moment after it is written. The settings
    ConfigMap (their parameter) must exist already: the bindings fail closed
    without it.
    """
    policies = [obj for obj in rendered if obj["kind"] in POLICY_KINDS]
    await apply.apply_objects(admin, policies)
    probes = [(resource_path("", "v1", "pods", namespace="tenant-root"), story.raw_pod_body("demo-probe")),
              (story.kubevirt_path("virtualmachineinstances", "tenant-root"), story.raw_vmi_body("demo-probe"))]
    for path, body in probes:
        async def refused(path: str = path, body: dict[str, Any] = body) -> bool | None:
            try:
                await admin.create(path, body, dry_run=True)
            except errors.ApiError as error:
                if "raw GPU names are forbidden" in error.message:
                    return True
                raise
            return None

        await story.until(refused, f"the raw-name policy refusing a {body['kind']}", time.monotonic(), timeout=30)
    return sorted(obj["metadata"]["name"] for obj in policies if obj["kind"].endswith("AdmissionPolicy"))


async def _leader(admin: Client) -> str:
    path = resource_path("coordination.k8s.io", "v1", "leases", namespace=CONTROLLER_NAMESPACE,
                         name=keys.LEADER_LEASE)
    async with asyncio.timeout(30):
        while True:
            lease = await admin.get_or_none(path)
            holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
            if holder:
                return str(holder)
            await asyncio.sleep(0.1)


async def run(plane: ControlPlane) -> int:
    async with plane.client() as admin:
        began = time.monotonic()
        await _ensure(admin, resource_path("", "v1", "namespaces"), {"metadata": {"name": CONTROLLER_NAMESPACE}})
        await _tenants(admin)
        for gpu_class in CLASSES:
            await _ensure(admin, resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL), gpu_class)
        await apply.install_kubevirt_crds(admin)
        await kubevirt_identity(admin)
        since = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        simnodes_pid = await asyncio.to_thread(start_simnodes, plane)
        reports, dra, rendered = await asyncio.gather(_reports(admin, since), dra_node(admin),
                                                      render_chart(admin, plane))
        print(f"simulated nodes, each read by the real agent (pid {simnodes_pid}, which keeps them reporting):")
        for (name, _), status in zip(simnodes.DEMO_NODES, reports, strict=True):
            print(f"  {name}: {status['deviceCount']} GPU functions, {status['allocatable']} allocatable, "
                  f"resource names {', '.join(status['resourceNames'])}")
        print(f"  {dra}: {DRA_GPUS} vfio GPU published by the simulated NVIDIA DRA driver (ResourceSlice "
              f"{dra_driver.slice_name(dra)}, DeviceClass {dra_driver.DEVICE_CLASS}), no agent: class "
              f"{story.DRA_CLASS} counts it from the slice")

        certs = await asyncio.to_thread(serving_certs, plane)
        await controller_identity(admin, plane, rendered)
        spec, running = await asyncio.to_thread(start_replicas, plane, certs)
        leader = await _leader(admin)
        kubevirt_pid = await asyncio.to_thread(start_kubevirt, plane)
        await register_webhooks(admin, plane, spec.url, rendered)
        logs = plane.directory / "logs"
        print(f"\ntwo controller replicas acting as {controller_user()[1]} (the chart's RBAC), both ready (their "
              "caches warm), both answering the webhooks:")
        targets = {target.replica: target for target in replicas.metrics_targets(plane.directory)}
        for replica in running:
            role = "leader: runs the binder" if replica.name == leader else "standby"
            target = targets.get(replica.name)
            metrics = (f"metrics {target.scheme}://{target.host}:{target.port}{target.path} (a token allowed get on "
                       "/metrics)") if target is not None else "metrics not recorded yet"
            print(f"  {replica.name} (pid {replica.pid}, {role}), {metrics}, log {logs / (replica.name + '.log')}")
        print(f"  the webhooks are registered at {spec.url}, a balancer that sends each connection to a replica "
              f"passing its readiness probe; a replica that ends is started again (log {logs / 'replicas.log'})")
        print(f"  the KubeVirt stand-in runs (pid {kubevirt_pid}, log {logs / 'kubevirt.log'})")
        settings = await _settings(admin)
        print(f"the leader published {CONTROLLER_NAMESPACE}/{keys.SETTINGS_CONFIGMAP}: "
              f"{json.dumps(settings, sort_keys=True)}")
        policies = await install_policies(admin, rendered)
        print(f"the chart's admission policies, rendered by helm from {apply.chart_dir()} and in force: "
              f"{', '.join(policies)}")
        cleared = await story.clear(admin)
        if cleared:
            print(f"cleared what an earlier run left: {', '.join(cleared)}")
        print(f"ready after {time.monotonic() - began:.1f} s\n")

        try:
            told = time.monotonic()
            await story.Story(admin).tell()
            print(f"   (steps 1-10 took {time.monotonic() - told:.1f} s)")
        except story.StoryError as error:
            print(f"cozygpu cluster demo: {error} (the controllers' logs are in {logs})", file=sys.stderr)
            return 1

        snapshot = await read_snapshot(admin, hoster_names=HOSTER_NAMES)
    print("11. the catalog: what each tenant can order now, and why not")
    for namespace, count in (("tenant-acme-ml", 2), ("tenant-beta", 1)):
        rows = [catalog_row(entry, snapshot, count) for entry in catalog(snapshot, namespace)]
        print(f"\n   cozygpu catalog -n {namespace} --count {count}")
        print(render_table(rows, count=count))
    by_hand = [
        (f"export KUBECONFIG={plane.kubeconfig}", ""),
        ("kubectl get gpudevices,vm -A", "the hold, its node, why, and how long held and idle"),
        (f"kubectl describe gpudevice {story.HELD} -n {story.ACME}", "its Events: Bound, Moved"),
        ("cozygpu status", "classes, nodes, devices waiting, the leader"),
        (f"kubectl gpu usage -n {story.USAGE_TENANT} --subtree", "GPUs held, running, idle; GPU-hours held, idle"),
        (f"cozygpu why gpudevice/{story.HELD} -n {story.ACME}", "the last decision and what would change it"),
        (f"kubectl patch vm {story.VM} -n {story.ACME} --type merge -p '{{\"spec\":{{\"running\":true}}}}'",
         "start it again, where its GPU now is"),
        (f"kubectl get resourceclaim {story.DRA_HELD} -n {story.ACME} -o yaml",
         "the DRA hold: allocated, reserved for the GPUDevice"),
        (f"kubectl describe pod {story.CLAIM_POD} -n {story.LAB}", "why kube-scheduler cannot place it"),
        ("cozygpu catalog -n tenant-acme", "what the parent tenant can still order"),
        ("./hack/up.sh", "the story again, from a tidy state"),
        (f"cozygpu cluster stop --dir {plane.directory}", "ends everything"),
    ]
    width = max(len(command) for command, note in by_hand if note)
    print("\ncontinue by hand:")
    for command, note in by_hand:
        print(f"  {command.ljust(width)}   # {note}" if note else f"  {command}")
    return 0


def background_health(directory: Path) -> list[tuple[str, int, str]]:
    """(name, pid, "ok" | "exited") of each background process a demo started, for ``cozygpu cluster status``."""
    rows = []
    for name in BACKGROUND:
        pid_file = directory / f"{name}.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text())
            rows.append((name, pid, "ok" if alive(pid, expect="cozygpu") else "exited"))
    return rows


def stop_background(directory: Path) -> None:
    """End the demo's background processes (the supervisor and its replicas, the stand-in), if they run."""
    for name in BACKGROUND:
        pid_file = directory / f"{name}.pid"
        if pid_file.exists():
            terminate(int(pid_file.read_text()), SUPERVISOR_STOP if name == "replicas" else 30, expect="cozygpu")
            pid_file.unlink()


def main(directory: Path) -> int:
    plane = ControlPlane.attach(directory)
    if not plane.full:
        print(f"cozygpu cluster demo: the control plane in {directory} runs only etcd and kube-apiserver; "
              "the demo needs the full plane (`cozygpu cluster start` without --api-only)", file=sys.stderr)
        return 1
    stop_background(directory)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    try:
        return asyncio.run(run(plane))
    except (DemoError, story.StoryError, errors.KubeError, TimeoutError, chart.ChartError) as error:
        print(f"cozygpu cluster demo: {error or type(error).__name__} (logs in {directory / 'logs'})",
              file=sys.stderr)
        return 1
