"""``cozygpu cluster demo``: the controller and a small GPU platform on the local control plane.

What it sets up, all through the real code paths where they can run here:

- two simulated GPU nodes — an HGX board with two H100s on vfio-pci, and a T4
  on the vGPU host driver with five mdev instances of two profiles — each a
  sysfs tree and a kubelet pod-resources socket (the two boundaries that
  cannot run on this machine), read by the **real agent**, which writes the
  real GPUNode objects;
- kwok-managed Nodes for them (``cozygpu.devcluster.nodes``: Ready, their
  allocatable what the device plugins report), two GPU offers (GPUClass), and Cozystack
  tenant namespaces with GPU budgets and the vGPU entitlement;
- the **controller** with GPU enabled as a background process (its pid in ``DIR/controller.pid``,
  its log in ``DIR/logs/controller.log``; ``cozygpu cluster stop`` ends it):
  it warms its caches (KubeVirt is not installed: it is ready anyway and
  joins those kinds when they appear), wins the lease and publishes the
  settings ConfigMap with the effective GPU resource names;
- the catalog each tenant sees, answered by the shared model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from cozygpu import keys
from cozygpu.agent.pods import ApiPodLookup
from cozygpu.agent.report import GPUNodeWriter
from cozygpu.agent.runner import Agent
from cozygpu.commands.catalog import catalog_row, read_snapshot, render_table
from cozygpu.devcluster import nodes, pki, sysfs_tree
from cozygpu.devcluster.fake_kubelet import Device, FakeKubelet
from cozygpu.devcluster.plane import ControlPlane, free_port, terminate
from cozygpu.kube import Client, errors, resource_path
from cozygpu.model.catalog import catalog

CONTROLLER_NAMESPACE = "cozy-gpu"
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


async def _simulated_node(admin: Client, name: str, work: Path, build: str) -> dict[str, Any]:
    """Lay out a node's sysfs and kubelet, create its kwok Node, and run the real agent once against them.

    The Node's allocatable carries what the simulated kubelet's device plugins
    report, so the Node and the GPUNode the agent writes agree.
    """
    tree = sysfs_tree.SysfsTree(work / name / "sys")
    kubelet = FakeKubelet(str(work / name / "kubelet.sock"))
    if build == "hgx":
        hgx = sysfs_tree.hgx_passthrough(tree)
        # KubeVirt's PCI device plugin hands out vfio functions by IOMMU group.
        groups = zip(hgx.groups, (0, 1), strict=True)
        kubelet.allocatable = [Device(hgx.resource, str(group), (numa,)) for group, numa in groups]
    else:
        t4 = sysfs_tree.mdev_parent(tree)
        kubelet.allocatable = [Device(t4.small_resource, uuid, (0,)) for uuid in t4.small]
        kubelet.allocatable += [Device(t4.big_resource, uuid, (0,)) for uuid in t4.big]
    gpus: dict[str, int] = {}
    for device in kubelet.allocatable:
        gpus[device.resource] = gpus.get(device.resource, 0) + 1
    await nodes.add_nodes(admin, [nodes.SimNode(name, gpus)])
    await nodes.wait_ready(admin, [name])
    await kubelet.start()
    try:
        agent = Agent(sysfs_root=tree.root, socket_path=kubelet.socket_path, writer=GPUNodeWriter(admin, name),
                      pod_lookup=ApiPodLookup(admin, name), kubelet_timeout=5.0)
        _, status = await agent.once()
    finally:
        await kubelet.stop()
    return status


def start_controller(plane: ControlPlane) -> tuple[int, int]:
    """The controller as a background process; returns (pid, health port)."""
    health, webhook = free_port(), free_port()
    certs = plane.directory / "webhook-certs"
    certs.mkdir(exist_ok=True)
    serving_ca = pki.KeyPair(plane.pki_dir / "serving-ca.crt", plane.pki_dir / "serving-ca.key")
    pki.issue(serving_ca, certs, "tls", common_name="cozygpu-webhook", hosts=("127.0.0.1", "localhost"), server=True)
    log = (plane.directory / "logs" / "controller.log").open("ab")
    argv = [sys.executable, "-m", "cozygpu", "controller", "--kubeconfig", str(plane.kubeconfig),
            "--namespace", CONTROLLER_NAMESPACE, "--health-addr", f"127.0.0.1:{health}",
            "--metrics-addr", f"127.0.0.1:{health}", "--identity", "demo-controller",
            "--gpu-resource-names", ",".join(HOSTER_NAMES), "--log-format", "text",
            "--enable-gpu", "--cert-dir", str(certs), "--webhook-addr", f"127.0.0.1:{webhook}"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    (plane.directory / "controller.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the controller exited with code {proc.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return proc.pid, health
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the controller was not ready within 30 s; see {log.name}")


async def _settings(admin: Client) -> dict[str, str]:
    path = resource_path("", "v1", "configmaps", namespace=CONTROLLER_NAMESPACE, name=keys.SETTINGS_CONFIGMAP)
    async with asyncio.timeout(30):
        found = await admin.get_or_none(path)
        while found is None:  # written by another process: poll
            await asyncio.sleep(0.2)
            found = await admin.get_or_none(path)
    data: dict[str, str] = found.get("data") or {}
    return data


async def run(plane: ControlPlane) -> int:
    async with plane.client() as admin:
        await _ensure(admin, resource_path("", "v1", "namespaces"), {"metadata": {"name": CONTROLLER_NAMESPACE}})
        await _tenants(admin)
        for gpu_class in CLASSES:
            await _ensure(admin, resource_path(keys.GROUP, keys.VERSION, keys.GPUCLASS_PLURAL), gpu_class)
        print("simulated nodes, read by the real agent:")
        with tempfile.TemporaryDirectory(prefix="cozygpu-demo-") as tmp:
            for name, build in (("gpu-1", "hgx"), ("gpu-2", "t4")):
                status = await _simulated_node(admin, name, Path(tmp), build)
                print(f"  {name}: {status['deviceCount']} GPU functions, {status['allocatable']} allocatable, "
                      f"resource names {', '.join(status['resourceNames'])}")

        pid, port = await asyncio.to_thread(start_controller, plane)
        print(f"\ncontroller running (pid {pid}), ready: http://127.0.0.1:{port}/readyz, "
              f"metrics: http://127.0.0.1:{port}/metrics, log: {plane.directory / 'logs' / 'controller.log'}")
        settings = await _settings(admin)
        print(f"the leader published {CONTROLLER_NAMESPACE}/{keys.SETTINGS_CONFIGMAP}: "
              f"{json.dumps(settings, sort_keys=True)}")

        snapshot = await read_snapshot(admin, hoster_names=HOSTER_NAMES)
    for namespace, count in (("tenant-acme-ml", 2), ("tenant-beta", 1)):
        rows = [catalog_row(entry, snapshot, count) for entry in catalog(snapshot, namespace)]
        print(f"\nwhat {namespace} can order (cozygpu catalog -n {namespace} --count {count}):")
        print(render_table(rows, count=count))
    print("\nnext:\n"
          f"  export KUBECONFIG={plane.kubeconfig}\n"
          "  kubectl get gpuclasses,gpunodes\n"
          "  cozygpu catalog -n tenant-acme\n"
          f"  cozygpu cluster stop --dir {plane.directory}")
    return 0


def stop_controller(directory: Path) -> None:
    pid_file = directory / "controller.pid"
    if pid_file.exists():
        terminate(int(pid_file.read_text()), 30, expect="cozygpu")
        pid_file.unlink()


def main(directory: Path) -> int:
    plane = ControlPlane.attach(directory)
    if not plane.full:
        print(f"cozygpu cluster demo: the control plane in {directory} runs only etcd and kube-apiserver; "
              "the demo needs the full plane (`cozygpu cluster start` without --api-only)", file=sys.stderr)
        return 1
    if (directory / "controller.pid").exists():
        stop_controller(directory)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    return asyncio.run(run(plane))
