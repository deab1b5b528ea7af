"""What the chart renders for the controller: the serving certificate it cannot start without, how it serves
``/metrics`` (HTTPS on its own port, probes plain) and the right to ask the API server who may read them."""

from __future__ import annotations

import base64
import subprocess
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from cozygpu.devcluster import apply, binaries, chart

GPU_ON = {"gpu": {"enabled": True}}


def secrets(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in chart.render(values) if o["kind"] == "Secret"}


def test_with_gpu_on_the_chart_generates_the_serving_certificate_the_deployment_mounts() -> None:
    objects = chart.render(GPU_ON)
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "cozygpu-controller")
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert secret["metadata"]["name"] == volume["secret"]["secretName"]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    key = serialization.load_pem_private_key(base64.b64decode(secret["data"]["tls.key"]), password=None)
    assert cert.public_key() == key.public_key()
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert f"cozygpu-controller-webhook.{chart.DEFAULT_NAMESPACE}.svc" in names
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    assert cert.issuer == ca.subject


def controller(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "cozygpu-controller")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_metrics_are_https_on_a_port_of_their_own_and_the_probes_stay_plain_on_theirs() -> None:
    container = controller(chart.render({}))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8081, "metrics": 8443}
    assert "--metrics-addr=:8443" in container["args"]
    assert "--health-addr=:8081" in container["args"]
    assert not any(arg.startswith("--metrics-cert-dir") for arg in container["args"]), "self-signed by default"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "scheme" not in container["readinessProbe"]["httpGet"], "kubelet probes plain HTTP"


def test_a_metrics_certificate_secret_is_mounted_where_the_controller_reads_it() -> None:
    objects = chart.render({"gpu": {"enabled": True}, "controller": {"metrics": {"certSecret": "metrics-tls"}}})
    container = controller(objects)
    assert "--metrics-cert-dir=/etc/cozygpu/metrics-tls" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"tls": "/etc/cozygpu/tls", "metrics-tls": "/etc/cozygpu/metrics-tls"}
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    volumes = {v["name"]: v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes == {"tls": "cozygpu-webhook-tls", "metrics-tls": "metrics-tls"}
    gpu_off = controller(chart.render({"controller": {"metrics": {"certSecret": "metrics-tls"}}}))
    assert [m["name"] for m in gpu_off["volumeMounts"]] == ["metrics-tls"]


def test_the_controller_may_ask_who_a_token_is_and_whether_it_may_read_metrics() -> None:
    objects = chart.render({})
    role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "cozygpu-controller")
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule.get("apiGroups", ())
               for resource in rule.get("resources", ()) for verb in rule["verbs"]}
    assert ("authentication.k8s.io", "tokenreviews", "create") in granted
    assert ("authorization.k8s.io", "subjectaccessreviews", "create") in granted


def test_a_platform_issued_certificate_or_gpu_off_renders_no_secret() -> None:
    assert secrets({"gpu": {"enabled": True}, "controller": {"generateWebhookCert": False}}) == {}
    assert secrets({}) == {}


@pytest.mark.parametrize("gpu", ["false", "true"])
def test_helm_lint_finds_no_error_in_the_chart(gpu: str) -> None:
    proc = subprocess.run([str(binaries.ensure_helm()), "lint", str(apply.chart_dir()), "--strict",
                           "--set", f"gpu.enabled={gpu}"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
