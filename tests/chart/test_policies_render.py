"""What the chart renders of the admission policies (SPEC §5): GPU on/off, capability gating, bindings.

Pure rendering with helm; what the policies do is tested against the API
server in tests/policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from cozygpu import keys
from cozygpu.devcluster import chart

VAP = "ValidatingAdmissionPolicy"
BINDING = "ValidatingAdmissionPolicyBinding"

ALWAYS = {"cozygpu-usage-monitor-label"}
GPU_PODS = {"cozygpu-raw-gpu-names-pods"}
GPU_CLAIMS = {"cozygpu-raw-gpu-claims"}
GPU_VMIS = {"cozygpu-raw-gpu-names-vmis"}
GPU_KINDS = {"cozygpu-agent-own-node", "cozygpu-device-protection", "cozygpu-class-protection",
             "cozygpu-class-deleting"}
EVERY_POLICY = ALWAYS | GPU_PODS | GPU_CLAIMS | GPU_VMIS | GPU_KINDS
#: Bindings acting in tenant namespaces only; the others match cluster-scoped kinds.
TENANT_BOUND = {"cozygpu-usage-monitor-label", "cozygpu-raw-gpu-names-pods", "cozygpu-raw-gpu-names-vmis",
                "cozygpu-raw-gpu-claims",
                "cozygpu-device-protection", "cozygpu-class-deleting"}

GPU_ON = {"gpu": {"enabled": True}}


def render(values: dict[str, Any] | None = None, *, api_versions: Sequence[str] = chart.EVERYTHING_SERVED,
           namespace: str = chart.DEFAULT_NAMESPACE) -> list[dict[str, Any]]:
    return chart.render(values or {}, api_versions=api_versions, namespace=namespace)


def named(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def policy_names(objects: list[dict[str, Any]]) -> set[str]:
    return set(named(objects, VAP))


def expressions(policy: dict[str, Any]) -> str:
    spec = policy["spec"]
    parts = [c["expression"] for c in spec.get("matchConditions", [])]
    parts += [v["expression"] for v in spec.get("variables", [])]
    parts += [v["expression"] + v.get("messageExpression", "") for v in spec["validations"]]
    return "\n".join(parts)


# -- what renders where -------------------------------------------------------------------


def test_with_gpu_off_only_the_usage_monitor_policy_renders() -> None:
    objects = render()
    assert policy_names(objects) == ALWAYS
    assert set(named(objects, BINDING)) == ALWAYS


def test_with_gpu_on_every_policy_renders_with_a_denying_binding_of_its_own_name() -> None:
    objects = render(GPU_ON)
    policies, bindings = named(objects, VAP), named(objects, BINDING)
    assert set(policies) == EVERY_POLICY
    assert set(bindings) == EVERY_POLICY
    for name, binding in bindings.items():
        assert binding["spec"]["policyName"] == name
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert policies[name]["spec"]["failurePolicy"] == "Fail"


def test_nothing_renders_where_the_cluster_serves_no_validating_admission_policy() -> None:
    served = [v for v in chart.EVERYTHING_SERVED if v != chart.VALIDATING_ADMISSION_POLICY]
    objects = render(GPU_ON, api_versions=served)
    assert not {obj["kind"] for obj in objects} & {VAP, BINDING}


def test_the_vmi_policy_waits_for_the_vmi_kind_to_be_served() -> None:
    without_kubevirt = [v for v in chart.EVERYTHING_SERVED if v != chart.VMI]
    assert policy_names(render(GPU_ON, api_versions=without_kubevirt)) == EVERY_POLICY - GPU_VMIS
    # An operator who knows better can say so, or keep it off.
    asserted = {**GPU_ON, "policies": {"kinds": {"kubevirt": True}}}
    assert policy_names(render(asserted, api_versions=without_kubevirt)) == EVERY_POLICY
    refused = {**GPU_ON, "policies": {"kinds": {"kubevirt": False}}}
    assert policy_names(render(refused)) == EVERY_POLICY - GPU_VMIS


def test_policies_on_gpu_kinds_render_on_a_first_install_with_the_crds_they_match() -> None:
    """A first install: the GPU kinds are not served yet, but this chart creates them in the same release.

    Without this the GPU-kind policies came only with the next upgrade, a
    window in which an agent could write any GPUNode and a tenant drop a
    device finalizer.
    """
    first_install = [chart.VALIDATING_ADMISSION_POLICY, chart.VMI]
    objects = render(GPU_ON, api_versions=first_install)
    assert policy_names(objects) == EVERY_POLICY
    crds = chart.render(GPU_ON, api_versions=first_install, include_crds=True)
    assert {obj["metadata"]["name"] for obj in crds if obj["kind"] == "CustomResourceDefinition"} == {
        f"{plural}.{keys.GROUP}" for plural in (keys.GPUCLASS_PLURAL, keys.GPUDEVICE_PLURAL, keys.GPUNODE_PLURAL)}
    refused = {**GPU_ON, "policies": {"kinds": {"gpu": False}}}
    assert policy_names(render(refused, api_versions=first_install)) == ALWAYS | GPU_PODS | GPU_CLAIMS | GPU_VMIS


def test_the_agent_is_bound_to_its_role_only_where_its_node_restriction_renders() -> None:
    """R-POL-2: no agent ever holds GPUNode write access that no policy narrows to its own node."""
    first_install = [chart.VALIDATING_ADMISSION_POLICY, chart.VMI]
    objects = render(GPU_ON, api_versions=first_install)
    assert "cozygpu-agent" in named(objects, "ClusterRoleBinding")
    assert "cozygpu-agent-own-node" in policy_names(objects)
    switched_off = render({**GPU_ON, "policies": {"kinds": {"gpu": False}}})
    assert "cozygpu-agent" in named(switched_off, "ClusterRole")
    assert "cozygpu-agent" not in named(switched_off, "ClusterRoleBinding")
    assert "cozygpu-agent-own-node" not in policy_names(switched_off)
    no_policies = render(GPU_ON, api_versions=[f"{keys.API_VERSION}/{keys.GPUNODE_KIND}"])
    assert "cozygpu-agent" not in named(no_policies, "ClusterRoleBinding")


def test_a_kinds_switch_other_than_auto_true_or_false_fails_the_render() -> None:
    with pytest.raises(chart.ChartError, match=r"policies\.kinds\.kubevirt must be auto, true or false"):
        render({**GPU_ON, "policies": {"kinds": {"kubevirt": "yes"}}})


# -- bindings and parameters --------------------------------------------------------------


def test_tenant_bindings_select_tenant_namespaces_by_the_chart_value() -> None:
    bindings = named(render(GPU_ON), BINDING)
    default = {"matchExpressions": [{"key": keys.TENANT_NAMESPACE_LABEL, "operator": "Exists"}]}
    for name in TENANT_BOUND:
        assert bindings[name]["spec"]["matchResources"] == {"namespaceSelector": default}, name
    for name in EVERY_POLICY - TENANT_BOUND:
        assert "matchResources" not in bindings[name]["spec"], name

    custom = {"matchExpressions": [{"key": "tenant.example.com/managed", "operator": "In", "values": ["true"]}]}
    bindings = named(render({**GPU_ON, "tenantNamespaceSelector": custom}), BINDING)
    for name in TENANT_BOUND:
        assert bindings[name]["spec"]["matchResources"] == {"namespaceSelector": custom}, name


def test_the_raw_name_bindings_take_the_settings_configmap_and_fail_closed_without_it() -> None:
    objects = render(GPU_ON, namespace="gpu-system")
    for name in GPU_PODS | GPU_CLAIMS | GPU_VMIS:
        assert named(objects, VAP)[name]["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
        assert named(objects, BINDING)[name]["spec"]["paramRef"] == {
            "name": keys.SETTINGS_CONFIGMAP, "namespace": "gpu-system", "parameterNotFoundAction": "Deny"}


def test_the_deleting_class_policy_is_evaluated_once_per_class() -> None:
    objects = render(GPU_ON)
    assert named(objects, VAP)["cozygpu-class-deleting"]["spec"]["paramKind"] == {
        "apiVersion": keys.API_VERSION, "kind": keys.GPUCLASS_KIND}
    assert named(objects, BINDING)["cozygpu-class-deleting"]["spec"]["paramRef"] == {
        "selector": {}, "parameterNotFoundAction": "Allow"}


# -- identities and keys ------------------------------------------------------------------


def test_platform_callers_are_the_configured_ones_and_the_controller_s_service_account() -> None:
    values = {**GPU_ON, "platformCallers": {"groups": ["ops:admins"], "users": ["ops-bot"]},
              "serviceAccounts": {"controller": "gpu-ctl", "agent": "gpu-agent"}}
    policy = named(render(values, namespace="gpu-system"), VAP)["cozygpu-device-protection"]
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert '["ops:admins"]' in condition
    assert '["ops-bot","system:serviceaccount:gpu-system:gpu-ctl"]' in condition
    assert "system:masters" not in condition


def test_the_agent_policy_matches_the_agent_s_service_account_of_the_release_namespace() -> None:
    values = {**GPU_ON, "serviceAccounts": {"controller": "gpu-ctl", "agent": "gpu-agent"}}
    policy = named(render(values, namespace="gpu-system"), VAP)["cozygpu-agent-own-node"]
    agent = "system:serviceaccount:gpu-system:gpu-agent"
    assert policy["spec"]["matchConditions"] == [
        {"name": "is-the-agent", "expression": f"request.userInfo.username == '{agent}'"}]


def test_kubevirt_controller_is_the_configured_service_account() -> None:
    values = {**GPU_ON, "kubevirt": {"namespace": "kubevirt", "controllerServiceAccount": "kubevirt-controller"}}
    policy = named(render(values), VAP)["cozygpu-raw-gpu-names-pods"]
    assert "'system:serviceaccount:kubevirt:kubevirt-controller'" in expressions(policy)


@pytest.mark.parametrize(("policy", "key"), [
    ("cozygpu-usage-monitor-label", keys.USAGE_MONITOR_LABEL),
    ("cozygpu-raw-gpu-names-vmis", keys.DEVICE_REFS_LABEL),
    ("cozygpu-agent-own-node", keys.NODE_NAME_EXTRA),
    ("cozygpu-device-protection", keys.DEVICE_FINALIZER),
    ("cozygpu-device-protection", keys.TEMPLATE_DEVICE_LABEL),
    ("cozygpu-class-protection", keys.CLASS_FINALIZER),
])
def test_the_policies_use_the_keys_of_the_package(policy: str, key: str) -> None:
    assert f"'{key}'" in expressions(named(render(GPU_ON), VAP)[policy])


# -- conventions --------------------------------------------------------------------------


def test_every_policy_and_binding_is_marked_as_the_platform_s() -> None:
    for obj in render(GPU_ON):
        if obj["kind"] in (VAP, BINDING):
            assert obj["metadata"]["labels"][keys.MANAGED_BY_COZYSTACK_LABEL] == "", obj["metadata"]["name"]


def test_every_refusal_has_a_message_expression_a_fallback_message_and_reason_forbidden() -> None:
    for name, policy in named(render(GPU_ON), VAP).items():
        for validation in policy["spec"]["validations"]:
            assert validation["messageExpression"], name
            assert validation["message"], name
            assert validation["reason"] == "Forbidden", name
