"""Install the fixture CRDs of kinds cozygpu reads but does not own, at any moment."""

from __future__ import annotations

from cozygpu.devcluster import apply
from cozygpu.kube import Client

FIXTURES = apply.STANDIN_CRDS

#: CRD name -> fixture file
FIXTURE_CRDS = {
    path.name.split("_", 1)[1].removesuffix(".yaml") + "." + path.name.split("_", 1)[0]: path
    for path in FIXTURES.glob("*.yaml")
}


async def install_fixture_crd(client: Client, name: str) -> None:
    """Install e.g. ``virtualmachineinstances.kubevirt.io`` and wait until it is served."""
    try:
        path = FIXTURE_CRDS[name]
    except KeyError:
        raise KeyError(f"no fixture CRD {name!r}; known: {sorted(FIXTURE_CRDS)}") from None
    await apply.apply_objects(client, apply.load_files([path]))


async def uninstall_fixture_crd(client: Client, name: str) -> None:
    await client.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
