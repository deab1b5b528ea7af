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
- two GPU offers (GPUClass) and Cozystack tenant namespaces with GPU budgets
  and the vGPU entitlement; the KubeVirt VM and VMI CRDs;
- ``controller-a`` and ``controller-b``: two replicas of the **controller**
  with GPU enabled; one wins the lease and runs the binder and the settings
  publisher, both warm their caches and serve the webhooks;
- the webhook configurations of the chart, registered by URL against the
  standby replica with the plane's serving CA (``register_webhooks``);
- ``kubevirt``: the KubeVirt stand-in (VM → VMI → launcher pod);
- then the story (``story.py``) and the catalog each tenant sees.

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
import urllib.request
from pathlib import Path
from typing import Any

import attrs

from cozygpu import keys
from cozygpu.admission.webhooks import configurations
from cozygpu.commands.catalog import catalog_row, read_snapshot, render_table
from cozygpu.devcluster import apply, pki, simnodes, story
from cozygpu.devcluster.plane import ControlPlane, alive, free_port, terminate
from cozygpu.kube import Client, errors, resource_path
from cozygpu.model.catalog import catalog


class DemoError(Exception):
    """The platform did not come up; the message says which part and where its log is."""

CONTROLLER_NAMESPACE = "cozy-gpu"
#: The webhooks' timeoutSeconds and the replicas' --webhook-timeout (their --bind-wait stays 10 s).
WEBHOOK_TIMEOUT = 15
HOSTER_NAMES = ("nvidia.com/GH100_H100_SXM5_80GB",)


def _gpu_class(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND, "metadata": {"name": name},
            "spec": {"source": {"devicePlugin": {}}, **spec}}


CLASSES = [
    _gpu_class("h100", vendor="NVIDIA", model="H100 SXM5 80GB", mode="Passthrough", memory="80Gi",
               resourceName="nvidia.com/GH100_H100_SXM5_80GB"),
    _gpu_class("t4-1q", vendor="NVIDIA", model="T4", mode="VGPU", profile="GRID T4-1Q", memory="1Gi",
               resourceName="nvidia.com/GRID_T4-1Q"),
]

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
    for name, (labels, budgets) in TENANTS.items():
        await _ensure(admin, resource_path("", "v1", "namespaces"), {"metadata": {"name": name, "labels": labels}})
        if budgets:
            await _ensure(admin, resource_path("", "v1", "resourcequotas", namespace=name),
                          {"metadata": {"name": keys.TENANT_QUOTA_NAME}, "spec": {"hard": budgets}})


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
    """A controller replica the demo runs in the background (pid in ``DIR/<name>.pid``)."""

    name: str
    pid: int
    health: int
    webhook: int


#: The background processes the demo starts; ``cozygpu cluster stop`` (and the next demo) ends them.
BACKGROUND = ("controller-a", "controller-b", "kubevirt", "simnodes")


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DemoError(f"{log.stem} exited with code {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise DemoError(f"{log.stem} was not ready within 30 s; see {log}")


def _background(plane: ControlPlane, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    log = (plane.directory / "logs" / f"{name}.log").open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    (plane.directory / f"{name}.pid").write_text(str(proc.pid))
    return proc


def serving_certs(plane: ControlPlane) -> Path:
    """The webhook serving certificate for 127.0.0.1, signed by the plane's serving CA (which the API server trusts)."""
    certs = plane.directory / "webhook-certs"
    certs.mkdir(exist_ok=True)
    serving_ca = pki.KeyPair(plane.pki_dir / "serving-ca.crt", plane.pki_dir / "serving-ca.key")
    pki.issue(serving_ca, certs, "tls", common_name="cozygpu-webhook", hosts=("127.0.0.1", "localhost"), server=True)
    return certs


def start_controller(plane: ControlPlane, name: str, certs: Path) -> Replica:
    """A controller replica (GPU on, webhooks served) as a background process, once its readiness says so."""
    health, webhook = free_port(), free_port()
    argv = [sys.executable, "-m", "cozygpu", "controller", "--kubeconfig", str(plane.kubeconfig),
            "--namespace", CONTROLLER_NAMESPACE, "--health-addr", f"127.0.0.1:{health}",
            "--metrics-addr", f"127.0.0.1:{health}", "--identity", name,
            "--gpu-resource-names", ",".join(HOSTER_NAMES), "--log-format", "text",
            "--enable-gpu", "--cert-dir", str(certs), "--webhook-addr", f"127.0.0.1:{webhook}",
            "--webhook-timeout", f"{WEBHOOK_TIMEOUT}s"]
    proc = _background(plane, name, argv)
    _wait_ready(proc, f"http://127.0.0.1:{health}/readyz", plane.directory / "logs" / f"{name}.log")
    return Replica(name, proc.pid, health, webhook)


def start_kubevirt(plane: ControlPlane) -> int:
    """The KubeVirt stand-in (``cozygpu.devcluster.kubevirt``) in the background: VM → VMI → launcher pod."""
    proc = _background(plane, "kubevirt", [sys.executable, "-m", "cozygpu.devcluster.kubevirt",
                                           "--dir", str(plane.directory)])
    time.sleep(0.2)
    if proc.poll() is not None:
        raise DemoError(f"the KubeVirt stand-in exited with code {proc.returncode}; "
                        f"see {plane.directory / 'logs' / 'kubevirt.log'}")
    return proc.pid


async def _settings(admin: Client) -> dict[str, str]:
    path = resource_path("", "v1", "configmaps", namespace=CONTROLLER_NAMESPACE, name=keys.SETTINGS_CONFIGMAP)
    async with asyncio.timeout(30):
        found = await admin.get_or_none(path)
        while found is None:  # written by another process: poll
            await asyncio.sleep(0.2)
            found = await admin.get_or_none(path)
    data: dict[str, str] = found.get("data") or {}
    return data


async def register_webhooks(admin: Client, plane: ControlPlane, replica: Replica) -> None:
    """The chart's webhook configurations, calling ``replica`` by URL with the plane's serving CA.

    In a cluster the webhooks call a Service in front of every ready replica;
    here they call one replica, the one that is not leading when the demo
    starts, so every answer comes from a standby's warm cache while the
    leader's binder decides.
    """
    ca = base64.b64encode(plane.ca_file.read_bytes()).decode()
    for body in configurations(f"https://127.0.0.1:{replica.webhook}", ca, timeout_seconds=WEBHOOK_TIMEOUT):
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
        since = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        simnodes_pid = await asyncio.to_thread(start_simnodes, plane)
        print(f"simulated nodes, each read by the real agent (pid {simnodes_pid}, which keeps them reporting):")
        for (name, _), status in zip(simnodes.DEMO_NODES, await _reports(admin, since), strict=True):
            print(f"  {name}: {status['deviceCount']} GPU functions, {status['allocatable']} allocatable, "
                  f"resource names {', '.join(status['resourceNames'])}")

        certs = await asyncio.to_thread(serving_certs, plane)
        replicas = [await asyncio.to_thread(start_controller, plane, name, certs)
                    for name in ("controller-a", "controller-b")]
        leader = await _leader(admin)
        standby = next(r for r in replicas if r.name != leader)
        kubevirt_pid = await asyncio.to_thread(start_kubevirt, plane)
        await register_webhooks(admin, plane, standby)
        logs = plane.directory / "logs"
        print("\ntwo controller replicas, both ready (their caches warm):")
        for replica in replicas:
            role = "leader: runs the binder" if replica.name == leader else "standby: answers the webhooks"
            print(f"  {replica.name} (pid {replica.pid}, {role}), metrics http://127.0.0.1:{replica.health}/metrics, "
                  f"log {logs / (replica.name + '.log')}")
        print(f"  the webhooks are registered by URL, calling {standby.name}; the KubeVirt stand-in runs "
              f"(pid {kubevirt_pid}, log {logs / 'kubevirt.log'})")
        settings = await _settings(admin)
        print(f"the leader published {CONTROLLER_NAMESPACE}/{keys.SETTINGS_CONFIGMAP}: "
              f"{json.dumps(settings, sort_keys=True)}")
        cleared = await story.clear(admin)
        if cleared:
            print(f"cleared what an earlier run left: {', '.join(cleared)}")
        print(f"ready after {time.monotonic() - began:.1f} s\n")

        try:
            told = time.monotonic()
            await story.Story(admin).tell()
            print(f"   (steps 1-6 took {time.monotonic() - told:.1f} s)")
        except story.StoryError as error:
            print(f"cozygpu cluster demo: {error} (the controllers' logs are in {logs})", file=sys.stderr)
            return 1

        snapshot = await read_snapshot(admin, hoster_names=HOSTER_NAMES)
    print("7. the catalog: what each tenant can order now, and why not")
    for namespace, count in (("tenant-acme-ml", 2), ("tenant-beta", 1)):
        rows = [catalog_row(entry, snapshot, count) for entry in catalog(snapshot, namespace)]
        print(f"\n   cozygpu catalog -n {namespace} --count {count}")
        print(render_table(rows, count=count))
    by_hand = [
        (f"export KUBECONFIG={plane.kubeconfig}", ""),
        ("kubectl get gpudevices,vm -A", "the hold, its node and why"),
        (f"kubectl describe gpudevice {story.HELD} -n {story.ACME}", "its Events: Bound, Moved"),
        ("cozygpu status", "classes, nodes, devices waiting, the leader"),
        (f"cozygpu why gpudevice/{story.HELD} -n {story.ACME}", "the last decision and what would change it"),
        (f"kubectl patch vm {story.VM} -n {story.ACME} --type merge -p '{{\"spec\":{{\"running\":true}}}}'",
         "start it again, where its GPU now is"),
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
    """End the demo's background processes (the replicas, the stand-in), if they run."""
    for name in BACKGROUND:
        pid_file = directory / f"{name}.pid"
        if pid_file.exists():
            terminate(int(pid_file.read_text()), 30, expect="cozygpu")
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
    except (DemoError, errors.KubeError, TimeoutError) as error:
        print(f"cozygpu cluster demo: {error or type(error).__name__} (logs in {directory / 'logs'})",
              file=sys.stderr)
        return 1
