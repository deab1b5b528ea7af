"""What the chart renders for the controller: the serving certificate it cannot start without."""

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


def test_a_platform_issued_certificate_or_gpu_off_renders_no_secret() -> None:
    assert secrets({"gpu": {"enabled": True}, "controller": {"generateWebhookCert": False}}) == {}
    assert secrets({}) == {}


@pytest.mark.parametrize("gpu", ["false", "true"])
def test_helm_lint_finds_no_error_in_the_chart(gpu: str) -> None:
    proc = subprocess.run([str(binaries.ensure_helm()), "lint", str(apply.chart_dir()), "--strict",
                           "--set", f"gpu.enabled={gpu}"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
