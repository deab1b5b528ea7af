"""The three webhooks on one aiohttp application, and how an API server is told to call them (R-ADM-1…6).

``AdmissionWebhooks(cache, client, config).install(app)`` adds the routes:

    POST /validate-gpudevice     GPUDevice, validating, CREATE      (R-ADM-1)
    POST /mutate-gpudevice       GPUDevice, mutating, CREATE        (its finalizer, R-BIND-9; only
                                 where no MutatingAdmissionPolicy can add it, see below)
    POST /mutate-vmi             VMI, mutating, CREATE, labelled    (R-ADM-2, R-ADM-3, R-ADM-5)
    POST /mutate-launcher-pod    Pod, mutating, CREATE, labelled    (R-ADM-4)

Each answers from this replica's warm cache (``SnapshotSource``), on every
replica. :func:`configurations` renders the webhook configurations for a URL
(the local cluster and the tests; the chart renders the same for a Service):
``failurePolicy: Fail`` (``Ignore`` on the best-effort finalizer hook), the
object selectors of R-ADM-6, ``sideEffects: NoneOnDryRun``,
``reinvocationPolicy: IfNeeded`` on the VMI hook, and
``timeoutSeconds`` from the configuration, which ``--bind-wait`` must fit
under (``flags``).

Where the cluster serves MutatingAdmissionPolicy (``chart.MUTATING_ADMISSION_POLICY``,
GA and on from Kubernetes 1.36), the order's finalizer is added by the API server itself
(:func:`finalizer_policy`) and ``configurations(finalizer_hook=False)``
leaves the finalizer hook out: an order's create then makes one webhook call,
not two. Older clusters keep the hook.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

import attrs
from aiohttp import web
from prometheus_client import CollectorRegistry

from cozygpu import keys
from cozygpu.admission.devices import DeviceFinalizerWebhook, DeviceWebhook
from cozygpu.admission.envelope import endpoint
from cozygpu.admission.metrics import AdmissionMetrics
from cozygpu.admission.pods import LauncherPodWebhook
from cozygpu.admission.view import SnapshotSource
from cozygpu.admission.vmi import VMIConfig, VMIWebhook
from cozygpu.base.clock import Clock
from cozygpu.cache.cache import Cache
from cozygpu.kube import Client
from cozygpu.model.capacity import DEFAULT_LAUNCHER_GRACE
from cozygpu.views.readmodel import ReadModel

DEVICE_PATH: Final = "/validate-gpudevice"
DEVICE_MUTATE_PATH: Final = "/mutate-gpudevice"
VMI_PATH: Final = "/mutate-vmi"
POD_PATH: Final = "/mutate-launcher-pod"
FINALIZER_POLICY_NAME: Final = "cozygpu-device-finalizer"
#: Configuration names: ``cozygpu-…`` sorts before KubeVirt's ``virt-api-mutator``, so it runs first.
VALIDATING_NAME: Final = "cozygpu-webhooks"
MUTATING_NAME: Final = "cozygpu-webhooks"
#: Seconds the envelope keeps for itself under ``timeoutSeconds`` (answer written before the API server gives up).
ENVELOPE_MARGIN: Final = 0.5
#: Seconds a VMI start needs beside its bind wait: checks, writes and, on failure, their undo.
WRITE_ROOM: Final = 3.0


@attrs.frozen(kw_only=True)
class AdmissionConfig:
    namespace: str
    bind_wait: float
    #: The webhooks' ``timeoutSeconds``, at most 30 (the API server's limit).
    timeout: float
    raw_names: str = keys.RAW_NAMES_ALLOW
    attachment_grace: timedelta = timedelta(minutes=2)
    hoster_names: tuple[str, ...] = ()
    launcher_grace: timedelta = DEFAULT_LAUNCHER_GRACE

    def __attrs_post_init__(self) -> None:
        if not 0 < self.timeout <= 30:
            raise ValueError(f"webhook timeout {self.timeout:g} s: must be 1 to 30 s (the API server's limit)")
        if self.bind_wait <= 0 or self.bind_wait + WRITE_ROOM > self.timeout:
            raise ValueError(f"bind wait {self.bind_wait:g} s must be positive and leave {WRITE_ROOM:g} s under "
                             f"the webhook timeout ({self.timeout:g} s)")


class AdmissionWebhooks:
    def __init__(self, cache: Cache, client: Client, config: AdmissionConfig, *,
                 registry: CollectorRegistry | None = None, clock: Clock | None = None,
                 model: ReadModel | None = None) -> None:
        """``model``: the process's read model, the binder's too (one of their own when None)."""
        self.config = config
        self.metrics = metrics = AdmissionMetrics.on(registry) if registry is not None else None
        self.source = SnapshotSource(cache, hoster_names=config.hoster_names, launcher_grace=config.launcher_grace,
                                     clock=clock, on_rebuild=(lambda why: metrics.rebuilds.labels(why).inc())
                                     if metrics is not None else None, model=model)
        self.devices = DeviceWebhook(self.source)
        self.finalizers = DeviceFinalizerWebhook()
        self.vmis = VMIWebhook(cache, client, self.source, VMIConfig(
            namespace=config.namespace, bind_wait=config.bind_wait,
            raw_forbidden=config.raw_names == keys.RAW_NAMES_FORBID, attachment_grace=config.attachment_grace),
            metrics=self.metrics, clock=clock)
        self.pods = LauncherPodWebhook(self.source)

    def install(self, app: web.Application) -> None:
        deadline = max(self.config.timeout - ENVELOPE_MARGIN, 0.5)
        app.router.add_route("*", DEVICE_PATH, endpoint("gpudevice", self.devices, deadline=deadline,
                                                         metrics=self.metrics))
        app.router.add_route("*", DEVICE_MUTATE_PATH, endpoint("gpudevice-finalizer", self.finalizers,
                                                                deadline=deadline, metrics=self.metrics))
        app.router.add_route("*", VMI_PATH, endpoint("vmi", self.vmis, deadline=deadline, metrics=self.metrics))
        app.router.add_route("*", POD_PATH, endpoint("launcher-pod", self.pods, deadline=deadline,
                                                      metrics=self.metrics))


def _client_config(base_url: str, path: str, ca_bundle: str) -> dict[str, Any]:
    return {"url": base_url.rstrip("/") + path, "caBundle": ca_bundle}


def configurations(base_url: str, ca_bundle: str, *, timeout_seconds: int,
                   namespace_selector: Mapping[str, Any] | None = None, name: str = MUTATING_NAME,
                   finalizer_hook: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ValidatingWebhookConfiguration, MutatingWebhookConfiguration) calling ``base_url`` by URL.

    ``ca_bundle`` is the base64 PEM of the CA that signed the server's
    certificate. ``namespace_selector`` narrows every hook (a test scopes
    them to its namespace). ``finalizer_hook=False`` leaves the finalizer
    hook out, for a cluster given :func:`finalizer_policy` instead.
    """
    selector = dict(namespace_selector or {})
    refs = {"matchExpressions": [{"key": keys.DEVICE_REFS_LABEL, "operator": "Exists"}]}
    launcher = {"matchExpressions": [{"key": keys.DEVICE_REFS_LABEL, "operator": "Exists"},
                                     {"key": keys.KUBEVIRT_LAUNCHER_LABEL, "operator": "In",
                                      "values": [keys.KUBEVIRT_LAUNCHER_VALUE]}]}
    common = {"admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "sideEffects": "NoneOnDryRun",
              "timeoutSeconds": timeout_seconds, "matchPolicy": "Equivalent", "namespaceSelector": selector}
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": "gpudevices.gpu.cozystack.io", **common,
            "clientConfig": _client_config(base_url, DEVICE_PATH, ca_bundle),
            "rules": [{"apiGroups": [keys.GROUP], "apiVersions": [keys.VERSION], "operations": ["CREATE"],
                       "resources": [keys.GPUDEVICE_PLURAL], "scope": "Namespaced"}],
        }],
    }
    # Best effort, so it fails open: an order admitted without its finalizer gets it from the binder's
    # finalizer work, and a mutation that cannot be made must not refuse an order the checks allow.
    finalizers = [{"name": "gpudevice-finalizers.gpu.cozystack.io", **common, "failurePolicy": "Ignore",
                   "clientConfig": _client_config(base_url, DEVICE_MUTATE_PATH, ca_bundle),
                   "rules": [{"apiGroups": [keys.GROUP], "apiVersions": [keys.VERSION], "operations": ["CREATE"],
                              "resources": [keys.GPUDEVICE_PLURAL], "scope": "Namespaced"}]}]
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            *(finalizers if finalizer_hook else []),
            {"name": "vmis.gpu.cozystack.io", **common, "reinvocationPolicy": "IfNeeded", "objectSelector": refs,
             "clientConfig": _client_config(base_url, VMI_PATH, ca_bundle),
             "rules": [{"apiGroups": ["kubevirt.io"], "apiVersions": ["v1"], "operations": ["CREATE"],
                        "resources": ["virtualmachineinstances"], "scope": "Namespaced"}]},
            {"name": "launcher-pods.gpu.cozystack.io", **common, "reinvocationPolicy": "IfNeeded",
             "objectSelector": launcher,
             "clientConfig": _client_config(base_url, POD_PATH, ca_bundle),
             "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                        "resources": ["pods"], "scope": "Namespaced"}]},
        ],
    }
    return validating, mutating


def finalizer_policy(*, namespace_selector: Mapping[str, Any] | None = None, name: str = FINALIZER_POLICY_NAME,
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(MutatingAdmissionPolicy, its binding): every order created without the device finalizer gets it from
    the API server, as the finalizer hook would give it, without a call out (the chart renders the same).

    It fails open like the hook (the binder's finalizer work adds a missing
    finalizer), leaves an order that carries it as it is, and appends to a
    list the order brings. ``namespace_selector`` narrows the binding.
    """
    finalizer = keys.DEVICE_FINALIZER
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [keys.GROUP], "apiVersions": ["*"], "operations": ["CREATE"],
                "resources": [keys.GPUDEVICE_PLURAL]}]},
            "matchConditions": [{
                "name": "finalizer-missing",
                "expression": f"!object.metadata.?finalizers.orValue([]).exists(f, f == '{finalizer}')"}],
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": (
                f"has(object.metadata.finalizers) "
                f"? [JSONPatch{{op: 'add', path: '/metadata/finalizers/-', value: '{finalizer}'}}] "
                f": [JSONPatch{{op: 'add', path: '/metadata/finalizers', value: ['{finalizer}']}}]")}}],
        },
    }
    bound: dict[str, Any] = {"policyName": name}
    if namespace_selector is not None:
        bound["matchResources"] = {"namespaceSelector": dict(namespace_selector)}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
               "metadata": {"name": name}, "spec": bound}
    return policy, binding
