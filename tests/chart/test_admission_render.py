"""The chart's webhook parts: the configurations the controller's webhooks expect, and the device-refs contract."""

from __future__ import annotations

from typing import Any

import pytest

from cozygpu import keys
from cozygpu.admission.refs import DeviceRef, TemplateRef, parse_refs
from cozygpu.admission.webhooks import (
    DEVICE_MUTATE_PATH,
    DEVICE_PATH,
    POD_PATH,
    VMI_PATH,
    configurations,
    finalizer_policy,
)
from cozygpu.devcluster import chart
from cozygpu.runtime import flags

GPU_ON = {"gpu": {"enabled": True}}


def of(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def without_client(hook: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in hook.items() if k not in ("clientConfig", "namespaceSelector")}


@pytest.mark.parametrize("minor", ["1.37", "1.33"])
def test_the_chart_registers_what_the_local_cluster_registers_trusting_the_serving_certificates_ca(minor: str) -> None:
    by_policy = minor == "1.37"  # MutatingAdmissionPolicy is served from 1.36: it gives the finalizer there
    objects = chart.render(GPU_ON, api_versions=chart.everything_served(minor), kube_version=minor)
    validating = of(objects, "ValidatingWebhookConfiguration", "cozygpu-webhooks")
    mutating = of(objects, "MutatingWebhookConfiguration", "cozygpu-webhooks")
    local_validating, local_mutating = configurations("https://x", "", timeout_seconds=15,
                                                      finalizer_hook=not by_policy)
    assert [without_client(h) for h in validating["webhooks"]] == [without_client(h) for h in
                                                                    local_validating["webhooks"]]
    assert [without_client(h) for h in mutating["webhooks"]] == [without_client(h) for h in local_mutating["webhooks"]]
    ca = of(objects, "Secret", "cozygpu-webhook-tls")["data"]["ca.crt"]
    hooks = [*validating["webhooks"], *mutating["webhooks"]]
    assert {h["clientConfig"]["caBundle"] for h in hooks} == {ca}
    paths = [DEVICE_PATH, VMI_PATH, POD_PATH] if by_policy else [DEVICE_PATH, DEVICE_MUTATE_PATH, VMI_PATH, POD_PATH]
    assert [h["clientConfig"]["service"]["path"] for h in hooks] == paths
    service = of(objects, "Service", hooks[0]["clientConfig"]["service"]["name"])
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    assert {(h["name"], h["failurePolicy"], h["sideEffects"]) for h in hooks if h["failurePolicy"] != "Fail"} == (
        set() if by_policy else {("gpudevice-finalizers.gpu.cozystack.io", "Ignore", "NoneOnDryRun")}), \
        "only the best-effort hook fails open"
    assert {h["sideEffects"] for h in hooks} == {"NoneOnDryRun"}
    assert next(h for h in mutating["webhooks"] if h["name"] == "vmis.gpu.cozystack.io")["reinvocationPolicy"] == \
        "IfNeeded"
    policies = [o for o in objects if o["kind"].startswith("MutatingAdmissionPolicy")]
    if not by_policy:
        assert policies == [], "a cluster before 1.36 serves no MutatingAdmissionPolicy: the hook gives the finalizer"
        return
    local_policy, local_binding = finalizer_policy()
    assert [(o["kind"], o["metadata"]["name"], o["spec"]) for o in policies] == [
        (o["kind"], o["metadata"]["name"], o["spec"]) for o in (local_policy, local_binding)]
    assert local_policy["spec"]["failurePolicy"] == "Ignore", "it fails open, as the hook it replaces"


def test_the_controller_is_told_the_timeout_the_webhooks_are_registered_with_and_accepts_its_bind_wait() -> None:
    objects = chart.render({**GPU_ON, "controller": {"webhookTimeoutSeconds": 20, "bindWait": "17s"}})
    args = of(objects, "Deployment", "cozygpu-controller")["spec"]["template"]["spec"]["containers"][0]["args"]
    options = flags.parse([*args[1:], "--namespace", "cozy-gpu"], env={})
    assert (options.webhook_timeout, options.bind_wait) == (20, 17)
    timeouts = {h["timeoutSeconds"] for o in objects if o["kind"].endswith("WebhookConfiguration")
                for h in o["webhooks"]}
    assert timeouts == {20}


@pytest.mark.parametrize(("controller", "expected"), [
    ({"bindWait": "13s"}, "must leave 3s under controller.webhookTimeoutSeconds=15"),
    ({"webhookTimeoutSeconds": 31}, "must be 1 to 30"),
    ({"bindWait": "1m"}, "write it in whole seconds"),
])
def test_a_bind_wait_without_room_under_the_timeout_fails_the_render(controller: dict[str, Any],
                                                                     expected: str) -> None:
    with pytest.raises(chart.ChartError, match=expected):
        chart.render({**GPU_ON, "controller": controller})
    with pytest.raises(flags.FlagError):
        flags.parse(["--namespace", "n", "--bind-wait", "13s", "--webhook-timeout", "15s"], env={})


def test_without_gpu_no_webhook_is_registered() -> None:
    kinds = {o["kind"] for o in chart.render({})}
    assert not kinds & {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}


#: The renderings the chart's device-refs helper gives for these references, pinned as they are written.
PINNED = {
    "held": ([{"device": "gpu-a"}], '[{"device":"gpu-a"}]'),
    "mixed": ([{"device": "gpu-a"}, {"template": "gpu", "class": "h100", "count": 2}],
              '[{"device":"gpu-a"},{"class":"h100","count":2,"template":"gpu"}]'),
}


def test_the_device_refs_helper_renders_the_pinned_label_and_annotation_the_webhook_reads_back() -> None:
    objects = chart.render({"deviceRefsExamples": {name: refs for name, (refs, _) in PINNED.items()}})
    for name, (_refs, pinned) in PINNED.items():
        example = of(objects, "ConfigMap", f"device-refs-example-{name}")
        assert example["metadata"]["labels"] == {keys.DEVICE_REFS_LABEL: "true"}
        assert example["metadata"]["annotations"][keys.DEVICE_REFS_ANNOTATION] == pinned
    assert parse_refs(PINNED["held"][1]) == (DeviceRef("gpu-a"),)
    assert parse_refs(PINNED["mixed"][1]) == (DeviceRef("gpu-a"), TemplateRef("gpu", "h100", 2))
