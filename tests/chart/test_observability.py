"""The chart's Grafana dashboard, PrometheusRule and ServiceMonitor: where they render, how the ServiceMonitor
scrapes (HTTPS, its own token, who may), and that the dashboard and rule read what the controller exports.

The metric names are taken from every PromQL expression of the rendered
dashboard and rule, and compared with the families a running controller
serves on its ``/metrics`` after a full pass over a small GPU world.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from cozygpu.devcluster import chart
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client
from cozygpu.runtime.controller import Controller
from tests.binder.test_controller_binder_api import serving_cert
from tests.binder.world import World
from tests.runtime.scraping import metrics_reader_token, scrape
from tests.runtime.test_controller_readiness import eventually, options, running
from tests.support.crds import install_fixture_crd

MONITORING = ("monitoring.coreos.com/v1/PrometheusRule", "monitoring.coreos.com/v1/ServiceMonitor")
METRIC = re.compile(r"\bcozygpu_[a-z0-9_]+\b")


def rendered(values: dict[str, Any] | None = None, *, monitoring: bool = True) -> list[dict[str, Any]]:
    served = (*chart.EVERYTHING_SERVED, *(MONITORING if monitoring else ()))
    return chart.render(values or {}, api_versions=served)


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def dashboard(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (configmap,) = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"] == "cozygpu-dashboard"]
    loaded: dict[str, Any] = json.loads(configmap["data"]["cozygpu.json"])
    return loaded


def expressions() -> list[str]:
    objects = rendered()
    found = [t["expr"] for p in dashboard(objects)["panels"] for t in p.get("targets", ())]
    found += [r["expr"] for o in of_kind(objects, "PrometheusRule") for g in o["spec"]["groups"] for r in g["rules"]]
    return found


def used_names() -> set[str]:
    return {name for expr in expressions() for name in METRIC.findall(expr)}


def test_the_dashboard_is_a_configmap_the_grafana_sidecar_picks_up() -> None:
    objects = rendered(monitoring=False)
    (configmap,) = [o for o in of_kind(objects, "ConfigMap") if o["metadata"]["name"] == "cozygpu-dashboard"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = dashboard(objects)
    assert board["uid"] == "cozygpu"
    titles = {p["title"] for p in board["panels"]}
    assert {"Held and free per class", "Held and free per node", "Bind answer latency", "Admission latency",
            "Refusals by reason", "Pass durations", "Lost GPUDevices", "Agent report age"} <= titles
    assert all(t["expr"] for p in board["panels"] for t in p.get("targets", ()))
    off = rendered({"monitoring": {"dashboard": {"enabled": False}}})
    assert "cozygpu-dashboard" not in {o["metadata"]["name"] for o in of_kind(off, "ConfigMap")}


def test_the_rule_and_the_service_monitor_render_only_where_their_kinds_are_served() -> None:
    assert of_kind(rendered(monitoring=False), "PrometheusRule") == []
    assert of_kind(rendered(monitoring=False), "ServiceMonitor") == []
    (rule,) = of_kind(rendered(), "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"CozygpuBindAnswerSlow", "CozygpuPassesFailing", "CozygpuDevicesLost", "CozygpuAgentReportStale",
            "CozygpuWebhookNoAnswer", "CozygpuTenantIdleHolds"} <= alerts
    (monitor,) = of_kind(rendered(), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    (service,) = [o for o in of_kind(rendered(), "Service") if o["metadata"]["name"] == "cozygpu-controller-metrics"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()


def service_monitor_endpoint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (monitor,) = of_kind(rendered(values), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert isinstance(endpoint, dict)
    return endpoint


def test_the_service_monitor_scrapes_https_with_its_own_token_and_skips_verifying_a_self_signed_certificate() -> None:
    endpoint = service_monitor_endpoint()
    assert (endpoint["scheme"], endpoint["path"]) == ("https", "/metrics")
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    (service,) = [o for o in of_kind(rendered(), "Service") if o["metadata"]["name"] == "cozygpu-controller-metrics"]
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["appProtocol"]) == ("metrics", "https")


def test_with_a_certificate_secret_the_service_monitor_verifies_it_against_its_ca() -> None:
    verify = {"tls": {"insecureSkipVerify": False}}
    endpoint = service_monitor_endpoint({"controller": {"metrics": {"certSecret": "metrics-tls"}},
                                         "monitoring": {"serviceMonitor": verify}})
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "metrics-tls", "key": "ca.crt"}},
                                     "serverName": f"cozygpu-controller-metrics.{chart.DEFAULT_NAMESPACE}.svc"}
    # The webhook's own Secret names the webhook Service, so that is the name verified.
    endpoint = service_monitor_endpoint({"gpu": {"enabled": True},
                                         "controller": {"metrics": {"certSecret": "cozygpu-webhook-tls"}},
                                         "monitoring": {"serviceMonitor": verify}})
    assert endpoint["tlsConfig"]["serverName"] == f"cozygpu-controller-webhook.{chart.DEFAULT_NAMESPACE}.svc"
    endpoint = service_monitor_endpoint({"controller": {"metrics": {"certSecret": "metrics-tls"}},
                                         "monitoring": {"serviceMonitor": {"tls": {"insecureSkipVerify": False,
                                                                                   "serverName": "m.example"}}}})
    assert endpoint["tlsConfig"]["serverName"] == "m.example"


def test_verifying_without_a_certificate_secret_is_refused_at_render() -> None:
    with pytest.raises(chart.ChartError, match=r"insecureSkipVerify=false needs controller\.metrics\.certSecret"):
        rendered({"monitoring": {"serviceMonitor": {"tls": {"insecureSkipVerify": False}}}})


def test_the_metrics_readers_of_the_values_are_bound_to_get_on_metrics() -> None:
    objects = rendered()
    (role,) = [o for o in of_kind(objects, "ClusterRole") if o["metadata"]["name"] == "cozygpu-metrics-reader"]
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    (binding,) = [o for o in of_kind(objects, "ClusterRoleBinding")
                  if o["metadata"]["name"] == "cozygpu-metrics-reader"]
    assert binding["roleRef"]["name"] == "cozygpu-metrics-reader"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vmagent-vmagent",
                                    "namespace": "cozy-monitoring"}]
    readers = [{"namespace": "monitoring", "name": "prometheus-k8s"}, {"namespace": "m2", "name": "vmagent"}]
    (binding,) = [o for o in of_kind(rendered({"monitoring": {"metricsReaders": readers}}), "ClusterRoleBinding")
                  if o["metadata"]["name"] == "cozygpu-metrics-reader"]
    assert [(s["namespace"], s["name"]) for s in binding["subjects"]] == [("monitoring", "prometheus-k8s"),
                                                                          ("m2", "vmagent")]
    nobody = rendered({"monitoring": {"metricsReaders": []}})
    assert "cozygpu-metrics-reader" not in {o["metadata"]["name"] for o in of_kind(nobody, "ClusterRoleBinding")}


def test_the_admission_answers_are_read_by_labels_the_counter_has() -> None:
    """The refusals-by-reason panel groups by ``reason``: a label the counter must carry, not an empty series."""
    from prometheus_client import CollectorRegistry

    from cozygpu.admission.metrics import AdmissionMetrics

    labels = set(AdmissionMetrics.on(CollectorRegistry()).answers._labelnames)
    assert "reason" in labels
    reading = [e for e in expressions() if "cozygpu_admission_answers_total" in e]
    assert any("reason" in e for e in reading), "no panel reads the reason"
    for expr in reading:
        grouped = {name.strip() for by in re.findall(r"by \(([^)]*)\)", expr) for name in by.split(",")}
        matched = set(re.findall(r"cozygpu_admission_answers_total\{([a-z_]+)", expr))
        assert grouped | matched <= labels, (expr, labels)


def test_the_rule_thresholds_come_from_the_values() -> None:
    (rule,) = of_kind(rendered({"monitoring": {"rules": {"answerLatencySeconds": 2, "reportStaleSeconds": 90,
                                                         "tenantIdleShare": 0.5, "tenantIdleFor": "2h"}}}),
                      "PrometheusRule")
    by_name = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert by_name["CozygpuBindAnswerSlow"]["expr"].endswith("> 2")
    assert by_name["CozygpuAgentReportStale"]["expr"].endswith("> 90")
    assert by_name["CozygpuTenantIdleHolds"]["expr"].rstrip().endswith("> 0.5")
    assert by_name["CozygpuTenantIdleHolds"]["for"] == "2h"


def exported(text: str) -> set[str]:
    """Every sample name the families of a /metrics page can carry (TYPE lines, so unset children count too)."""
    names: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("# TYPE "):
            continue
        _, _, family, kind = line.split()
        if kind == "histogram":
            names |= {f"{family}_bucket", f"{family}_count", f"{family}_sum"}
        elif kind == "counter":
            names |= {family, family.removesuffix("_total") + "_total"}
        else:
            names.add(family)
    return names


#: One controller run serves every test of the module that needs its page.
_LIVE: dict[str, str] = {}


async def live_metrics(plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> str:
    """``/metrics`` of a leading controller with GPU on, after its binder's first full pass over a world."""
    if "text" in _LIVE:
        return _LIVE["text"]
    await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
    world = await World.make(admin, namespace)
    try:
        await world.node("n1", 2)
        await world.order("held", 1)
        serving_cert(plane, tmp_path)
        controller = Controller(options(f"ctl-{uuid.uuid4().hex[:6]}", "--enable-gpu", "--cert-dir",
                                        str(tmp_path)), admin)
        await admin.create("/api/v1/namespaces", {"metadata": {"name": controller.options.namespace}})
        token = await metrics_reader_token(plane, admin, namespace)
        async with running(controller):
            async def passed() -> bool:
                text = (await scrape(controller, token))[1]
                return f'cozygpu_binder_devices{{class="{world.gpu_class}",phase="Bound"}} 1.0' in text

            await eventually(passed, timeout=60)
            _LIVE["text"] = (await scrape(controller, token))[1]
    finally:
        await world.cleanup()
    return _LIVE["text"]


async def test_every_metric_the_dashboard_and_the_rule_read_is_one_the_controller_exports(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    live = exported(await live_metrics(plane, admin, namespace, tmp_path))
    used = used_names()
    assert used - live == set()
    assert {"cozygpu_binder_class_units", "cozygpu_binder_node_units", "cozygpu_binder_devices",
            "cozygpu_binder_node_report_timestamp_seconds", "cozygpu_binder_answer_latency_seconds_bucket",
            "cozygpu_pass_duration_seconds_bucket", "cozygpu_passes_total", "cozygpu_leader_is_leader",
            "cozygpu_admission_duration_seconds_bucket", "cozygpu_admission_answers_total",
            "cozygpu_admission_bind_wait_seconds_bucket", "cozygpu_admission_bind_wait_seconds_count"} <= used, \
        "the walk found the expressions of every panel and alert"
