"""The rendered chart applies cleanly to an empty control plane of both minors, GPU on and off.

Each case starts a control plane of its own: the session's shared ones
already hold CRDs and other suites' objects, and the whole chart (webhooks
that fail closed included) must not land there. The API server compiles every
policy expression on create with the CEL environment of its minor, so a clean
apply on 1.33 is the check that the policies use nothing newer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cozygpu.devcluster import apply, binaries, chart
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client
from tests.support.crds import install_fixture_crd
from tests.support.planes import start_plane

MINORS = binaries.MINORS
VAPS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
GPU_KIND_POLICIES = {"cozygpu-agent-own-node", "cozygpu-device-protection", "cozygpu-class-protection",
                     "cozygpu-class-deleting"}


@pytest.fixture(params=MINORS, ids=[f"k8s{m}" for m in MINORS])
async def empty_plane(request: pytest.FixtureRequest) -> AsyncIterator[ControlPlane]:
    plane = await asyncio.to_thread(start_plane, request.param)
    yield plane
    await asyncio.to_thread(plane.stop)


async def install(admin: Client, plane: ControlPlane, values: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``helm upgrade --install`` does: render against what the cluster serves now, then apply."""
    served = await chart.served_api_versions(admin)
    objects = await asyncio.to_thread(chart.render, values, api_versions=served, kube_version=plane.minor,
                                      include_crds=True)
    await apply.apply_objects(admin, objects, namespace=chart.DEFAULT_NAMESPACE)
    return objects


async def names_on_server(admin: Client, path: str) -> set[str]:
    return {item["metadata"]["name"] for item in (await admin.list_objects(path))["items"]}


def policies(objects: list[dict[str, Any]]) -> set[str]:
    return {obj["metadata"]["name"] for obj in objects if obj["kind"] == "ValidatingAdmissionPolicy"}


async def test_with_gpu_on_the_chart_installs_then_upgrades_as_its_kinds_appear(empty_plane: ControlPlane) -> None:
    values = {"gpu": {"enabled": True, "rawNames": "forbid"}}
    async with empty_plane.client() as admin:
        await admin.create("/api/v1/namespaces", {"metadata": {"name": chart.DEFAULT_NAMESPACE}})

        first = await install(admin, empty_plane, values)
        assert policies(first) == {"cozygpu-usage-monitor-label", "cozygpu-raw-gpu-names-pods",
                                  "cozygpu-raw-gpu-claims"} | GPU_KIND_POLICIES, (
            "on an empty cluster the policies on kinds nobody serves yet stay out (the ordering hazard), "
            "those on the chart's own CRDs come with them")

        second = await install(admin, empty_plane, values)
        assert policies(second) == policies(first)

        await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
        third = await install(admin, empty_plane, values)
        assert policies(third) == policies(second) | {"cozygpu-raw-gpu-names-vmis"}

        assert await names_on_server(admin, VAPS) == policies(third)
        assert await names_on_server(admin, BINDINGS) == policies(third)


async def test_with_gpu_off_the_chart_installs_only_the_usage_monitor_policy(empty_plane: ControlPlane) -> None:
    async with empty_plane.client() as admin:
        await admin.create("/api/v1/namespaces", {"metadata": {"name": chart.DEFAULT_NAMESPACE}})
        await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
        await install(admin, empty_plane, {"gpu": {"enabled": False}})
        upgraded = await install(admin, empty_plane, {"gpu": {"enabled": False}})
        assert policies(upgraded) == {"cozygpu-usage-monitor-label"}
        assert await names_on_server(admin, VAPS) == {"cozygpu-usage-monitor-label"}
        assert await names_on_server(admin, BINDINGS) == {"cozygpu-usage-monitor-label"}
