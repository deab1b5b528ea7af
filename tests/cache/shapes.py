"""Objects shaped like the real ones, for cache tests and the cache bench.

A launcher pod is modelled on what virt-controller renders for a VM with one
GPU (labels, annotations and owner copied from the VMI, the compute container
with its environment and volume mounts, the container-disk init containers,
affinity, tolerations). Sizes matter here, not exact values.
"""

from __future__ import annotations

import uuid
from typing import Any

from cozygpu import keys

Obj = dict[str, Any]

GPU_RESOURCE = "nvidia.com/GH100_H100_SXM5_80GB"


def launcher_pod(namespace: str, vmi: str, *, node: str, vmi_uid: str | None = None, gpus: int = 1) -> Obj:
    """A virt-launcher pod for VMI ``vmi`` on ``node``, as the API server would accept it on create."""
    vmi_uid = vmi_uid or str(uuid.uuid4())
    name = f"virt-launcher-{vmi}-{uuid.uuid4().hex[:5]}"
    env = [
        {"name": "XDG_CACHE_HOME", "value": "/var/run/kubevirt-private"},
        {"name": "XDG_CONFIG_HOME", "value": "/var/run/kubevirt-private"},
        {"name": "XDG_RUNTIME_DIR", "value": "/var/run"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "KUBEVIRT_RESOURCE_NAME_gpu0", "value": GPU_RESOURCE},
        {"name": "PCI_RESOURCE_NVIDIA_COM_GH100_H100_SXM5_80GB", "value": "0000:3b:00.0"},
    ]
    mounts = [
        {"mountPath": "/var/run/kubevirt-private", "name": "private"},
        {"mountPath": "/var/run/kubevirt/sockets", "name": "public"},
        {"mountPath": "/var/run/kubevirt/container-disks", "mountPropagation": "HostToContainer",
         "name": "container-disks"},
        {"mountPath": "/var/run/libvirt", "name": "libvirt-runtime"},
        {"mountPath": "/var/run/kubevirt/hotplug-disks", "mountPropagation": "HostToContainer",
         "name": "hotplug-disks"},
        {"mountPath": "/var/run/kubevirt-ephemeral-disks", "name": "ephemeral-disks"},
        {"mountPath": "/var/run/kubevirt/sidecars", "name": "sidecars"},
        {"mountPath": "/var/log/kubevirt", "name": "libvirt-log"},
    ]
    compute_requests = {"cpu": "4", "memory": "17Gi", "devices.kubevirt.io/kvm": "1",
                        "devices.kubevirt.io/tun": "1", "devices.kubevirt.io/vhost-net": "1",
                        "ephemeral-storage": "50M", GPU_RESOURCE: str(gpus)}
    compute_limits = {"cpu": "4", "memory": "17Gi", "devices.kubevirt.io/kvm": "1",
                      "devices.kubevirt.io/tun": "1", "devices.kubevirt.io/vhost-net": "1", GPU_RESOURCE: str(gpus)}
    init = {
        "name": "container-disk-binary",
        "image": "quay.io/kubevirt/virt-launcher:v1.6.2",
        "command": ["/usr/bin/cp", "/usr/bin/container-disk", "/init/usr/bin/container-disk"],
        "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": {"cpu": "100m", "memory": "40M"}, "requests": {"cpu": "10m", "memory": "1M"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True, "runAsUser": 107},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [{"mountPath": "/init/usr/bin", "name": "virt-bin-share-dir"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "kubevirt.io": "virt-launcher",
                "kubevirt.io/created-by": vmi_uid,
                "vm.kubevirt.io/name": vmi,
                "vmi.kubevirt.io/id": vmi,
                "kubevirt.io/nodeName": node,
                "app.kubernetes.io/instance": vmi,
                "apps.cozystack.io/application.kind": "VMInstance",
                "apps.cozystack.io/application.name": vmi,
                keys.DEVICE_REFS_LABEL: "true",
            },
            "annotations": {
                "kubevirt.io/domain": vmi,
                "kubectl.kubernetes.io/default-container": "compute",
                "kubevirt.io/migrationTransportUnix": "true",
                "descheduler.alpha.kubernetes.io/request-evict-only": "",
                "post.hook.backup.velero.io/command": '["/usr/bin/virt-freezer", "--unfreeze", "--name", '
                                                      f'"{vmi}", "--namespace", "{namespace}"]',
                "pre.hook.backup.velero.io/command": '["/usr/bin/virt-freezer", "--freeze", "--name", '
                                                     f'"{vmi}", "--namespace", "{namespace}"]',
                keys.DEVICE_REFS_ANNOTATION: '[{"device":"' + vmi + '-gpu"}]',
            },
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": vmi,
                                 "uid": vmi_uid, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "compute",
                "image": "quay.io/kubevirt/virt-launcher:v1.6.2",
                "command": ["/usr/bin/virt-launcher-monitor", "--qemu-timeout", "270s", "--name", vmi, "--uid",
                            vmi_uid, "--namespace", namespace, "--kubevirt-share-dir", "/var/run/kubevirt",
                            "--ephemeral-disk-dir", "/var/run/kubevirt-ephemeral-disks", "--container-disk-dir",
                            "/var/run/kubevirt/container-disks", "--grace-period-seconds", "45",
                            "--hook-sidecars", "0", "--ovmf-path", "/usr/share/OVMF", "--run-as-nonroot"],
                "env": env,
                "imagePullPolicy": "IfNotPresent",
                "resources": {"limits": compute_limits, "requests": compute_requests},
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                                    "privileged": False, "runAsGroup": 107, "runAsNonRoot": True,
                                    "runAsUser": 107},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "volumeMounts": mounts,
            }],
            "initContainers": [init, {**init, "name": "volumecontainerdisk-init",
                                      "command": ["/usr/bin/container-disk", "--no-op"]}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "node-labeller.kubevirt.io/obsolete-host-model",
                                       "operator": "DoesNotExist"}]}]}}},
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": False,
            "hostname": vmi,
            "nodeSelector": {"kubevirt.io/schedulable": "true", "cpu-model.node.kubevirt.io/Skylake": "true"},
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
            "readinessGates": [{"conditionType": "kubevirt.io/virtual-machine-unpaused"}],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "securityContext": {"fsGroup": 107, "runAsGroup": 107, "runAsNonRoot": True, "runAsUser": 107},
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 210,
            "tolerations": [
                {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "tolerationSeconds": 300},
                {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "tolerationSeconds": 300},
            ],
            "volumes": [
                {"emptyDir": {}, "name": "private"},
                {"emptyDir": {}, "name": "public"},
                {"emptyDir": {}, "name": "sockets"},
                {"emptyDir": {}, "name": "virt-bin-share-dir"},
                {"emptyDir": {}, "name": "libvirt-runtime"},
                {"emptyDir": {}, "name": "ephemeral-disks"},
                {"emptyDir": {}, "name": "container-disks"},
                {"emptyDir": {}, "name": "libvirt-log"},
                {"emptyDir": {}, "name": "sidecars"},
                {"emptyDir": {}, "name": "hotplug-disks"},
            ],
        },
    }


def launcher_pod_status(pod: Obj) -> Obj:
    """A Running status for ``pod``, as kubelet would report it (conditions, container statuses, IPs)."""
    started = "2026-12-01T10:00:00Z"
    container_statuses = [{
        "containerID": "containerd://" + uuid.uuid4().hex + uuid.uuid4().hex,
        "image": "quay.io/kubevirt/virt-launcher:v1.6.2",
        "imageID": "quay.io/kubevirt/virt-launcher@sha256:" + uuid.uuid4().hex + uuid.uuid4().hex,
        "lastState": {}, "name": "compute", "ready": True, "restartCount": 0, "started": True,
        "state": {"running": {"startedAt": started}},
    }]
    init_statuses = [{
        "containerID": "containerd://" + uuid.uuid4().hex, "image": "quay.io/kubevirt/virt-launcher:v1.6.2",
        "imageID": "quay.io/kubevirt/virt-launcher@sha256:" + uuid.uuid4().hex, "lastState": {}, "name": c["name"],
        "ready": True, "restartCount": 0, "started": False,
        "state": {"terminated": {"containerID": "containerd://x", "exitCode": 0, "finishedAt": started,
                                 "reason": "Completed", "startedAt": started}},
    } for c in pod["spec"]["initContainers"]]
    conditions = [{"lastProbeTime": None, "lastTransitionTime": started, "status": "True", "type": t}
                  for t in ("kubevirt.io/virtual-machine-unpaused", "PodReadyToStartContainers", "Initialized",
                            "Ready", "ContainersReady", "PodScheduled")]
    return {"status": {
        "phase": "Running", "conditions": conditions, "containerStatuses": container_statuses,
        "initContainerStatuses": init_statuses, "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
        "podIP": "10.244.1.17", "podIPs": [{"ip": "10.244.1.17"}], "qosClass": "Burstable",
        "startTime": started,
    }}


def node(name: str) -> Obj:
    """A worker Node with GPU capacity, labels and an image list like a real one."""
    capacity = {"cpu": "128", "memory": "1056Gi", "pods": "250", "ephemeral-storage": "1Ti", GPU_RESOURCE: "8",
                "devices.kubevirt.io/kvm": "1k", "devices.kubevirt.io/tun": "1k", "devices.kubevirt.io/vhost-net": "1k"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "kubevirt.io/schedulable": "true", "nvidia.com/gpu.present": "true",
            "node.kubernetes.io/instance-type": "gpu-h100x8", "topology.kubernetes.io/zone": "zone-a",
        }},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {"capacity": capacity, "allocatable": capacity,
                   "images": [{"names": [f"registry.example/image-{i}@sha256:{uuid.uuid4().hex}"],
                               "sizeBytes": 100_000_000 + i} for i in range(30)]},
    }


def gpu_device(namespace: str, name: str, *, class_name: str = "h100", count: int = 1) -> Obj:
    """A GPUDevice order (spec only; status is written through the status subresource)."""
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.GPUDEVICE_KIND,
        "metadata": {"name": name, "namespace": namespace, "finalizers": [keys.DEVICE_FINALIZER]},
        "spec": {"className": class_name, "count": count},
    }


def gpu_device_status(node_name: str, vmi: str | None = None) -> Obj:
    """A Bound status on ``node_name``, attached to ``vmi`` when given."""
    status: Obj = {"phase": "Bound", "nodeName": node_name, "observedGeneration": 1, "conditions": [
        {"type": "Bound", "status": "True", "reason": "Placed", "message": f"holds 1 unit on {node_name}",
         "lastTransitionTime": "2026-12-01T10:00:00Z", "observedGeneration": 1}]}
    if vmi is not None:
        status["attachment"] = {"vmi": vmi, "uid": str(uuid.uuid4()), "attachedAt": "2026-12-01T10:00:00Z",
                                "requestId": uuid.uuid4().hex}
    return {"status": status}
