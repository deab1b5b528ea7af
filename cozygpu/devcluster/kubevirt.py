"""A stand-in for KubeVirt's virt-controller (and the one step of virt-handler the tests see).

KubeVirt cannot run here (no nodes, no libvirt), but the binder, the webhooks,
the demo and the benchmarks need what it does at its API boundary: VMIs made
from VirtualMachines, launcher pods made from VMIs, and the VMI status that
names them. This module is that boundary, written from the project's
reference notes (``kubernetes-kubevirt-kubelet.md`` §1.2–1.4), and the one
copy of it everyone uses.

What it imitates:

- **VM → VMI.** A VirtualMachine with ``spec.running: true`` or a
  ``runStrategy`` of ``Always``, ``RerunOnFailure`` or ``Once`` gets a VMI of
  its own name from ``spec.template`` (its labels and annotations, its spec),
  with a controller ownerReference to the VM. ``running: false`` or
  ``runStrategy: Halted`` deletes that VMI; ``Manual`` leaves it alone.
- **VMI → launcher pod** (``launcher_pod``, template.go / renderresources.go):
  ``generateName: virt-launcher-<vmi>-`` (the API server adds five random
  characters); the VMI's labels copied (so the device-refs label reaches the
  pod, SPEC §1.4), then ``kubevirt.io=virt-launcher``,
  ``kubevirt.io/created-by=<vmi uid>``, ``vm.kubevirt.io/name=<hostname>`` and
  ``vmi.kubevirt.io/id``; a controller ownerReference (``blockOwnerDeletion``)
  to the VMI; one ``compute`` container whose requests **and** limits carry 1
  per ``gpus`` and ``hostDevices`` entry with a ``deviceName`` (no claim),
  summed per name, beside cpu and memory; then the VMI's own
  ``domain.resources`` **replace** any key they share, as KubeVirt ≥ 0.56 does
  (§1.4 ⚠: never put a GPU name there as well); ``nodeSelector``,
  ``affinity`` and ``tolerations`` copied from the VMI.
- **DRA devices** (KubeVirt 1.9, gates ``GPUsWithDRA`` and ``HostDevicesWithDRA``
  Beta, so on; renderresources.go ``WithGPUsDRA`` / ``WithHostDevicesDRA``,
  template.go, pkg/dra/resource_claims.go ``ToPodResourceClaims``): a
  ``gpus`` or ``hostDevices`` entry with ``claimName`` / ``requestName`` and
  no ``deviceName`` adds no extended resource but one
  ``{name: claimName, request: requestName}`` to the compute container's
  ``resources.claims``: the gpus' first, then the hostDevices', in order, not
  deduplicated (``request`` left out when empty). The VMI's
  ``spec.resourceClaims`` become the pod's, every entry in order, referenced
  or not (``name`` with ``resourceClaimName`` or
  ``resourceClaimTemplateName``). An entry with both a ``deviceName`` and a
  claim renders neither: KubeVirt's DRA admitter refuses it.
- **VMI status** (lifecycle.go): ``activePods`` is ``{uid: spec.nodeName}``
  over every pod controlled by the VMI, whatever its phase (``""`` while
  unscheduled). An unprocessed VMI (phase ``""`` or ``Pending``) gets its pod in
  its first pass, then its finalizer, then one status write of where it stands by
  then (virt-api's mutator writes the finalizer and ``Pending`` at creation, and
  virt-controller creates the pod and writes ``Scheduling`` in its first sync; here
  a VMI is ``Pending`` only while it has no pod). Phases: ``""`` (``Pending`` while
  its pod is refused) → (pod created) ``Scheduling`` →
  (pod Running on its node) ``Scheduled`` with ``status.nodeName`` →
  ``Running`` (virt-handler's step, taken at once) ; a pod that Succeeded or
  Failed makes the VMI Succeeded or Failed, and a VMI that had a pod and lost
  it Fails. A refused pod creation (an admission webhook, a quota) is written
  as the ``Synchronized=False`` condition with reason ``FailedCreate`` and the
  API server's message, and retried.
- **Deletion.** A VMI carries virt-controller's ``foregroundDeleteVirtualMachine``
  finalizer from its first pass. A VMI being deleted turns Succeeded (virt-handler
  shuts the domain down), has its pods deleted, keeps listing them in
  ``activePods`` while they exist, and loses the finalizer once they are all
  gone (lifecycle.go: ``IsFinal`` and ``allPodsDeleted``): so a launcher is
  proven for as long as it runs, stop included. A VMI whose controlling VM is
  gone is deleted. (On the full plane the garbage collector deletes pods of a
  gone VMI too; the fast plane has none.)

What it does not: migrations (one pod per VMI; ``activePods`` still lists
every controlled pod), restarts (a Failed VMI stays Failed, whatever the run
strategy), VM status, virt-launcher's volumes, environment, annotations
copied from the VMI, memory overhead and KubeVirt's own affinity terms,
instancetypes and preferences, ``permittedHostDevices`` checks, the DRA
admitter's checks (a claim naming no ``resourceClaims`` entry reaches the API
server, which refuses the pod), DRA networks (``NetworkDevicesWithDRA`` is
alpha, off), the ``kubevirt.io/nodeName`` label, events, the VM controller's
finalizer.

Contract: ``KubeVirtStandIn(client).run()`` lives in its caller's task group
until cancelled. It reads through an informer cache of its own (VMs, VMIs,
``kubevirt.io=virt-launcher`` pods; optionally one namespace), and every pass
is level-triggered: it compares what the stores hold with what should be and
writes the difference, with resourceVersion preconditions; after each create
it waits until its store has seen the write, so a pass never creates twice.
The pods are created by ``client``'s identity (KubeVirt's is the
``kubevirt-controller`` service account): hand it the client the test needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import logging
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.cache import Cache, CacheError, FrozenDict, KindSpec, Store
from cozygpu.cache.store import IndexFunc
from cozygpu.kube import Client, Obj, errors, resource_path

log = logging.getLogger(__name__)

GROUP: Final = "kubevirt.io"
#: virt-controller's finalizer on every VMI: removed once the VMI is final and all its pods are gone.
VMI_FINALIZER: Final = "foregroundDeleteVirtualMachine"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
VM_KIND: Final = "VirtualMachine"
VMI_KIND: Final = "VirtualMachineInstance"

CREATED_BY_LABEL: Final = "kubevirt.io/created-by"
VM_NAME_LABEL: Final = "vm.kubevirt.io/name"
VMI_ID_LABEL: Final = "vmi.kubevirt.io/id"
DOMAIN_ANNOTATION: Final = "kubevirt.io/domain"
COMPUTE: Final = "compute"
#: No image is ever pulled: kwok "runs" the pod.
LAUNCHER_IMAGE: Final = "cozygpu.invalid/virt-launcher"

#: Run strategies that want a VMI, and the one that wants none (``Manual``: neither).
RUNNING_STRATEGIES: Final = frozenset({"Always", "RerunOnFailure", "Once"})
HALTED: Final = "Halted"
FINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})

#: Index of launcher pods (and VMIs) by the UID of their controlling owner.
CONTROLLER: Final = "controller-uid"


def controller_of(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The ownerReference with ``controller: true`` when it is of ``kind`` (kubevirt.io), else None."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == kind and str(ref.get("apiVersion", "")).startswith(GROUP):
            found: Mapping[str, Any] = ref
            return found
    return None


def _index_controller(kind: str) -> IndexFunc:
    def indexer(obj: FrozenDict) -> Iterable[str]:
        ref = controller_of(obj, kind)
        return (ref["uid"],) if ref and ref.get("uid") else ()

    return indexer


def controller_ref(owner: Mapping[str, Any], kind: str) -> Obj:
    """``metav1.NewControllerRef``: controller, blocking its owner's foreground deletion."""
    meta = owner["metadata"]
    return {"apiVersion": API_VERSION, "kind": kind, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def wants_running(vm: Mapping[str, Any]) -> bool | None:
    """Whether a VM wants its VMI: True, False (delete it) or None (``Manual``: leave it)."""
    spec = vm.get("spec") or {}
    strategy = spec.get("runStrategy")
    if strategy is not None:
        if strategy in RUNNING_STRATEGIES:
            return True
        return False if strategy == HALTED else None
    return bool(spec.get("running"))


def vmi_from_vm(vm: Mapping[str, Any]) -> Obj:
    """The VMI a VM starts: its template's metadata and spec, its name, owned by the VM."""
    template = copy.deepcopy(dict((vm.get("spec") or {}).get("template") or {}))
    meta = template.get("metadata") or {}
    metadata: Obj = {"name": vm["metadata"]["name"], "namespace": vm["metadata"]["namespace"],
                     "ownerReferences": [controller_ref(vm, VM_KIND)]}
    for key in ("labels", "annotations"):
        if meta.get(key):
            metadata[key] = dict(meta[key])
    return {"apiVersion": API_VERSION, "kind": VMI_KIND, "metadata": metadata, "spec": template.get("spec") or {}}


def host_name(vmi: Mapping[str, Any]) -> str:
    """``dns.SanitizeHostname``: ``spec.hostname``, else the name up to its first dot, at most 63."""
    hostname = (vmi.get("spec") or {}).get("hostname")
    return str(hostname) if hostname else vmi["metadata"]["name"].split(".", 1)[0][:63]


def vmi_id(name: str) -> str:
    """The ``vmi.kubevirt.io/id`` value: the name, or a prefix plus 8 hex of its SHA-1 past 63 characters.

    (KubeVirt's exact prefix length is not in the reference; any 63-character
    value that stays unique per name serves the tests.)
    """
    if len(name) <= 63:
        return name
    return f"{name[:54]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _device_entries(vmi: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The VMI's ``gpus`` entries, then its ``hostDevices`` entries (KubeVirt's rendering order)."""
    devices = (((vmi.get("spec") or {}).get("domain") or {}).get("devices")) or {}
    return [*(devices.get("gpus") or ()), *(devices.get("hostDevices") or ())]


def _has_claim(entry: Mapping[str, Any]) -> bool:
    """Whether KubeVirt decodes a ``ClaimRequest`` from the entry: either key present, inlined in it."""
    return "claimName" in entry or "requestName" in entry


def device_counts(vmi: Mapping[str, Any]) -> dict[str, int]:
    """One unit per ``gpus`` and ``hostDevices`` entry with a deviceName and no claim, summed per name."""
    counts: dict[str, int] = {}
    for entry in _device_entries(vmi):
        name = entry.get("deviceName")
        if name and not _has_claim(entry):
            counts[name] = counts.get(name, 0) + 1
    return counts


def container_claims(vmi: Mapping[str, Any]) -> list[Obj]:
    """The compute container's ``resources.claims``: one per entry with a claim and no deviceName.

    ``{name: claimName, request: requestName}`` in the order of
    ``_device_entries``, duplicates kept (renderresources.go ``WithGPUsDRA``,
    ``WithHostDevicesDRA``); ``request`` is left out when empty, as its
    ``omitempty`` does.
    """
    claims: list[Obj] = []
    for entry in _device_entries(vmi):
        if not entry.get("deviceName") and _has_claim(entry):
            claim: Obj = {"name": entry.get("claimName") or ""}
            if entry.get("requestName"):
                claim["request"] = entry["requestName"]
            claims.append(claim)
    return claims


def pod_resource_claims(vmi: Mapping[str, Any]) -> list[Obj]:
    """The pod's ``spec.resourceClaims``: every VMI ``resourceClaims`` entry, in order (``ToPodResourceClaims``)."""
    fields = ("name", "resourceClaimName", "resourceClaimTemplateName")
    return [{k: claim[k] for k in fields if claim.get(k) is not None}
            for claim in (vmi.get("spec") or {}).get("resourceClaims") or ()]


def compute_resources(vmi: Mapping[str, Any]) -> Obj:
    """The compute container's requests and limits (renderresources.go, KubeVirt ≥ 0.56).

    The device counts go on both requests and limits; cpu and memory default
    to the VMI's (memory from ``domain.memory.guest`` when no request names
    it); then every key the VMI's ``domain.resources`` sets replaces the
    computed value (so a GPU name there replaces its count instead of adding
    to it). The DRA entries' claims go beside them, in ``claims``.
    """
    domain = (vmi.get("spec") or {}).get("domain") or {}
    own = domain.get("resources") or {}
    counts = {name: str(count) for name, count in device_counts(vmi).items()}
    requests: dict[str, Any] = {"cpu": "100m", "memory": str((domain.get("memory") or {}).get("guest") or "128Mi"),
                                **counts}
    limits: dict[str, Any] = dict(counts)
    requests.update(own.get("requests") or {})
    limits.update(own.get("limits") or {})
    resources: Obj = {"requests": requests}
    if limits:
        resources["limits"] = limits
    if claims := container_claims(vmi):
        resources["claims"] = claims
    return resources


def launcher_pod(vmi: Mapping[str, Any]) -> Obj:
    """The launcher pod virt-controller renders for ``vmi`` (see the module docstring)."""
    meta = vmi["metadata"]
    spec = vmi.get("spec") or {}
    name = meta["name"]
    labels = {**(meta.get("labels") or {}),
              keys.KUBEVIRT_LAUNCHER_LABEL: keys.KUBEVIRT_LAUNCHER_VALUE,
              CREATED_BY_LABEL: meta["uid"],
              VM_NAME_LABEL: host_name(vmi),
              VMI_ID_LABEL: vmi_id(name)}
    pod_spec: Obj = {
        "containers": [{"name": COMPUTE, "image": LAUNCHER_IMAGE, "resources": compute_resources(vmi)}],
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
    }
    for key in ("nodeSelector", "affinity", "tolerations", "schedulerName", "priorityClassName",
                "terminationGracePeriodSeconds"):
        if spec.get(key) is not None:
            pod_spec[key] = copy.deepcopy(spec[key])
    if claims := pod_resource_claims(vmi):
        pod_spec["resourceClaims"] = claims
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": f"virt-launcher-{name}-",
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {DOMAIN_ANNOTATION: name, "kubectl.kubernetes.io/default-container": COMPUTE,
                            "kubevirt.io/migrationTransportUnix": "true"},
            "ownerReferences": [controller_ref(vmi, VMI_KIND)],
        },
        "spec": pod_spec,
    }


def desired_status(vmi: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> Obj:
    """The VMI status fields the stand-in owns, from the pods it controls (one step of the phase ladder)."""
    status = vmi.get("status") or {}
    phase = status.get("phase") or ""
    active = {p["metadata"]["uid"]: (p.get("spec") or {}).get("nodeName") or "" for p in pods}
    out: Obj = {"activePods": active}
    live = [p for p in pods if not (p["metadata"].get("deletionTimestamp"))]
    pod = max(live, key=lambda p: p["metadata"].get("creationTimestamp") or "", default=None)
    if phase in FINAL_PHASES:
        return out
    if pod is None:
        out["phase"] = "Failed" if phase in ("Scheduling", "Scheduled", "Running") else "Pending"
        return out
    pod_phase = (pod.get("status") or {}).get("phase")
    node = (pod.get("spec") or {}).get("nodeName") or ""
    if pod_phase in FINAL_PHASES:
        out["phase"] = pod_phase
    elif pod_phase == "Running" and node:
        # Scheduled first (virt-controller), Running on the next pass (virt-handler's report).
        out["phase"] = "Running" if phase in ("Scheduled", "Running") else "Scheduled"
        out["nodeName"] = node
    else:
        out["phase"] = "Scheduling"
    return out


def _synchronized(message: str | None) -> list[Obj]:
    if message is None:
        return []
    return [{"type": "Synchronized", "status": "False", "reason": "FailedCreate", "message": message}]


class KubeVirtStandIn:
    """virt-controller's VM, VMI and launcher-pod loops, at their API boundary (see the module docstring)."""

    def __init__(self, client: Client, *, namespace: str | None = None, concurrency: int = 16,
                 retry_interval: float = 1.0, wait_timeout: float = 30.0) -> None:
        self._client = client
        self._concurrency = concurrency
        self._retry_interval = retry_interval
        self._wait_timeout = wait_timeout
        self.vms = KindSpec(GROUP, VERSION, "virtualmachines", VM_KIND, True, namespace=namespace)
        self.vmis = KindSpec(GROUP, VERSION, "virtualmachineinstances", VMI_KIND, True, namespace=namespace,
                             indexers={CONTROLLER: _index_controller(VM_KIND)})
        self.pods = KindSpec("", "v1", "pods", "Pod", True, namespace=namespace,
                             label_selector=f"{keys.KUBEVIRT_LAUNCHER_LABEL}={keys.KUBEVIRT_LAUNCHER_VALUE}",
                             indexers={CONTROLLER: _index_controller(VMI_KIND)})
        # A registry of its own: the stand-in's informers are not the controller's metrics.
        self.cache = Cache(client, registry=CollectorRegistry())
        for spec in (self.vms, self.vmis, self.pods):
            self.cache.add(spec)
        #: Why the last pod creation of a VMI failed, by (namespace, name); cleared on success.
        self._refused: dict[tuple[str, str], str] = {}

    async def run(self) -> None:
        """Reconcile until cancelled: a pass per burst of changes, and again soon after a failed write."""
        trigger = self.cache.trigger(self.vms, self.vmis, self.pods, name="kubevirt-standin")
        async with self.cache.running():
            while True:
                failed = await self.sync_once()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._retry_interval if failed else None):
                        await trigger.wait()

    async def sync_once(self) -> bool:
        """One pass over every VM, VMI and launcher pod; True when some write failed (the caller retries)."""
        try:
            vms, pods = self.cache.store(self.vms), self.cache.store(self.pods)
            self.cache.store(self.vmis)
        except CacheError:
            return False  # a kind not served or not listed yet: its trigger fires when it is
        gate = asyncio.Semaphore(self._concurrency)
        failures = 0

        async def guarded(step: Coroutine[Any, Any, None], what: str) -> None:
            nonlocal failures
            async with gate:
                try:
                    await step
                except (errors.KubeError, CacheError, TimeoutError) as err:
                    failures += 1
                    log.info("kubevirt stand-in: %s: %s", what, err)

        async with asyncio.TaskGroup() as group:
            for vm in vms.list():
                group.create_task(guarded(self._sync_vm(vm), f"VM {_key(vm)}"))
        # Read the VMIs after the VM step: it waited until its store had seen each VMI it created.
        vmis = self.cache.store(self.vmis)
        vm_uids = {vm["metadata"]["uid"] for vm in vms.list()}
        vmi_uids = {vmi["metadata"]["uid"] for vmi in vmis.list()}
        async with asyncio.TaskGroup() as group:
            for vmi in vmis.list():
                owner = controller_of(vmi, VM_KIND)
                if owner is not None and owner.get("uid") not in vm_uids and not vmi["metadata"].get(
                        "deletionTimestamp"):
                    group.create_task(guarded(self._delete(self.vmis, vmi), f"VMI {_key(vmi)} of a gone VM"))
                else:
                    group.create_task(guarded(self._sync_vmi(vmi, pods), f"VMI {_key(vmi)}"))
            for pod in pods.list():
                owner = controller_of(pod, VMI_KIND)
                if owner is not None and owner.get("uid") not in vmi_uids:
                    group.create_task(guarded(self._delete(self.pods, pod), f"pod {_key(pod)} of a gone VMI"))
        return failures > 0

    async def _sync_vm(self, vm: Mapping[str, Any]) -> None:
        meta = vm["metadata"]
        want = wants_running(vm)
        vmi = self.cache.store(self.vmis).get(meta["namespace"], meta["name"])
        if want and vmi is None and not meta.get("deletionTimestamp"):
            created = await self._client.create(_collection(self.vmis, meta["namespace"]), vmi_from_vm(vm))
            await self._seen(self.vmis, created)
        elif want is False and vmi is not None and _controlled_by(vmi, VM_KIND, meta["uid"]):
            await self._delete(self.vmis, vmi)

    async def _sync_vmi(self, vmi: Mapping[str, Any], pods: Store) -> None:
        meta = vmi["metadata"]
        key = (meta["namespace"], meta["name"])
        owned = pods.by_index(CONTROLLER, meta["uid"])
        finalizers = list(meta.get("finalizers") or ())
        if meta.get("deletionTimestamp"):
            for pod in owned:
                await self._delete(self.pods, pod)
            if owned:
                stopped = {**desired_status(vmi, owned), "phase": "Succeeded"}
                stopped.pop("nodeName", None)
                await self._write_status(vmi, stopped, None)
            elif VMI_FINALIZER in finalizers:
                await self._finalizers(vmi, [f for f in finalizers if f != VMI_FINALIZER])
            return
        refusal: errors.ApiError | None = None
        phase = (vmi.get("status") or {}).get("phase") or ""
        if not owned and phase in ("", "Pending"):  # unprocessed: its pod first, as virt-controller's sync
            try:
                created = await self._client.create(_collection(self.pods, meta["namespace"]), launcher_pod(vmi))
            except errors.ApiError as err:
                if isinstance(err, errors.TooManyRequests | errors.ServerError):
                    raise
                refusal = err
                self._refused[key] = str(err)
            else:
                self._refused.pop(key, None)
                await self._seen(self.pods, created)
        if VMI_FINALIZER not in finalizers:  # virt-api's mutator adds it at creation; here, the first pass
            vmi = await self._finalizers(vmi, [*finalizers, VMI_FINALIZER])
        # One status write, of the pods as they are now: placed or run while this pass wrote, a pod is named as
        # such at once (virt-api's Pending at creation is not written apart: a VMI with a pod is past it).
        owned = self.cache.store(self.pods).by_index(CONTROLLER, meta["uid"])
        await self._write_status(vmi, desired_status(vmi, owned), self._refused.get(key))
        if refusal is not None:
            raise refusal

    async def _finalizers(self, vmi: Mapping[str, Any], finalizers: list[str]) -> Mapping[str, Any]:
        """Write the VMI's finalizers (the whole list: a merge patch replaces lists), on its resourceVersion."""
        meta = vmi["metadata"]
        path = f"{_collection(self.vmis, meta['namespace'])}/{meta['name']}"
        written = await self._client.merge_patch(path, {"metadata": {"finalizers": finalizers}},
                                                 resource_version=meta["resourceVersion"])
        await self._seen(self.vmis, written)
        return written

    async def _write_status(self, vmi: Mapping[str, Any], wanted: Obj, refused: str | None) -> Mapping[str, Any]:
        """Merge-patch the status fields that differ, preconditioned on the VMI's resourceVersion; the VMI as
        written (``vmi`` when nothing differed)."""
        status = vmi.get("status") or {}
        conditions = [c for c in status.get("conditions") or () if c.get("type") != "Synchronized"]
        wanted["conditions"] = conditions + _synchronized(refused)
        patch: Obj = {k: v for k, v in wanted.items() if status.get(k) != v}
        if not patch:
            return vmi
        if "activePods" in patch:  # a merge patch keeps map keys it does not name: null the ones gone
            gone = set(status.get("activePods") or {}) - set(wanted["activePods"])
            patch["activePods"] = {**wanted["activePods"], **dict.fromkeys(gone)}
        meta = vmi["metadata"]
        path = f"{_collection(self.vmis, meta['namespace'])}/{meta['name']}/status"
        written = await self._client.merge_patch(path, {"status": patch}, resource_version=meta["resourceVersion"])
        await self._seen(self.vmis, written)
        return written

    async def _delete(self, spec: KindSpec, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return
        with contextlib.suppress(errors.NotFound):
            await self._client.delete(f"{_collection(spec, meta['namespace'])}/{meta['name']}", uid=meta["uid"])

    async def _seen(self, spec: KindSpec, written: Mapping[str, Any]) -> Store:
        """Wait until ``spec``'s store has seen our write (R-BIND-2), so the next pass cannot repeat it."""
        version = written["metadata"]["resourceVersion"]
        return await self.cache.wait_for_resource_version(spec, version, timeout=self._wait_timeout)


def _controlled_by(obj: Mapping[str, Any], kind: str, uid: str) -> bool:
    ref = controller_of(obj, kind)
    return ref is not None and ref.get("uid") == uid


def _collection(spec: KindSpec, namespace: str) -> str:
    return resource_path(spec.group, spec.version, spec.plural, namespace=namespace)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


async def serve(client: Client, directory: Path, stop: asyncio.Event) -> None:
    """The stand-in until ``stop`` (``directory``, the plane's, is not needed: the client says where)."""
    async with asyncio.TaskGroup() as tasks:
        standin = tasks.create_task(KubeVirtStandIn(client).run(), name="kubevirt-standin")
        await stop.wait()
        standin.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cozygpu.devcluster.kubevirt --dir DIR``: the stand-in against a local plane until SIGTERM."""
    from cozygpu.devcluster import background  # the plane's modules are not needed by the tests' stand-in

    return background.main("python -m cozygpu.devcluster.kubevirt",
                           "the KubeVirt stand-in against a local plane, until SIGTERM", serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
