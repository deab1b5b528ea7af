"""Render the Helm chart (``manifests/``) with ``helm template``.

Development tooling for the tests and the local control plane, not the
controller. ``render`` is blocking (it runs helm as a subprocess); call it
through ``asyncio.to_thread`` from async code.

The chart gates templates on ``.Capabilities`` (the policies render only where
the kinds they match are served, SPEC §5), and ``helm template`` has no
cluster to ask, so the caller says what the cluster serves: ``api_versions``
entries of the form ``group/version`` or ``group/version/Kind``, as helm's
``--api-versions`` takes them. ``served_api_versions`` reads them from a live
API server, which is what ``helm install`` would see there.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from cozygpu import keys
from cozygpu.devcluster import apply, binaries
from cozygpu.kube import Client, errors

VALIDATING_ADMISSION_POLICY: Final = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
#: Served (GA, on by default) from Kubernetes 1.36: where it is, the order's finalizer comes from the chart's
#: MutatingAdmissionPolicy and the finalizer webhook is left out (``admission.webhooks.finalizer_policy``).
MUTATING_ADMISSION_POLICY: Final = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
VMI: Final = "kubevirt.io/v1/VirtualMachineInstance"
GPU_KINDS: Final = tuple(
    f"{keys.API_VERSION}/{kind}" for kind in (keys.GPUCLASS_KIND, keys.GPUDEVICE_KIND, keys.GPUNODE_KIND)
)
#: A cluster that serves everything the chart can match: the policy APIs, the GPU kinds, KubeVirt's VMI.
EVERYTHING_SERVED: Final = (VALIDATING_ADMISSION_POLICY, MUTATING_ADMISSION_POLICY, *GPU_KINDS, VMI)
#: Kubernetes serves MutatingAdmissionPolicy (v1) from this minor on.
MUTATING_POLICY_MINOR: Final = (1, 36)


def everything_served(minor: str) -> tuple[str, ...]:
    """``EVERYTHING_SERVED`` as a cluster of ``minor`` ("1.33") has it: without MutatingAdmissionPolicy before 1.36."""
    if tuple(map(int, minor.split("."))) >= MUTATING_POLICY_MINOR:
        return EVERYTHING_SERVED
    return tuple(v for v in EVERYTHING_SERVED if v != MUTATING_ADMISSION_POLICY)

DEFAULT_NAMESPACE: Final = "cozy-gpu"
DEFAULT_RELEASE: Final = "cozygpu"


class ChartError(RuntimeError):
    """helm could not render the chart; the message carries helm's own error."""


def render(
    values: Mapping[str, Any] | None = None,
    *,
    api_versions: Sequence[str] = EVERYTHING_SERVED,
    kube_version: str = binaries.DEFAULT_MINOR,
    namespace: str = DEFAULT_NAMESPACE,
    release: str = DEFAULT_RELEASE,
    include_crds: bool = False,
    chart: Path | None = None,
) -> list[dict[str, Any]]:
    """The chart's objects for ``values``, as ``helm template`` renders them.

    ``include_crds=False`` leaves out the CustomResourceDefinitions (they are
    plain templates of the chart, so this filters by kind). ``kube_version``
    is a minor such as ``"1.33"``.
    """
    helm = binaries.ensure_helm()
    with tempfile.TemporaryDirectory(prefix="cozygpu-render-") as tmp:
        values_file = Path(tmp) / "values.yaml"
        values_file.write_text(yaml.safe_dump(dict(values or {})))
        argv = [
            str(helm), "template", release, str(chart or apply.chart_dir()),
            "--namespace", namespace,
            "--kube-version", kube_version,
            "--values", str(values_file),
        ]
        for api_version in api_versions:
            argv += ["--api-versions", api_version]
        env = {**os.environ, "HELM_CACHE_HOME": tmp, "HELM_CONFIG_HOME": tmp, "HELM_DATA_HOME": tmp}
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise ChartError(f"helm template failed (exit {proc.returncode}): {proc.stderr.strip()}")
    objects = apply.load_yaml_documents(proc.stdout)
    if not include_crds:
        objects = [obj for obj in objects if obj.get("kind") != "CustomResourceDefinition"]
    return objects


async def served_api_versions(client: Client) -> list[str]:
    """What ``.Capabilities.APIVersions`` holds on this cluster: every served group/version and group/version/Kind."""
    core = await client.get("/api/v1")
    served = ["v1", *(f"v1/{r['kind']}" for r in core.get("resources", []) if "/" not in r["name"])]
    for group in (await client.get("/apis")).get("groups", []):
        for version in group.get("versions", []):
            group_version: str = version["groupVersion"]
            try:
                listing = await client.get(f"/apis/{group_version}")
            except errors.NotFound:
                continue
            served.append(group_version)
            served += [f"{group_version}/{r['kind']}" for r in listing.get("resources", []) if "/" not in r["name"]]
    return served
