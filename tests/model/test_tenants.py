from __future__ import annotations

import pytest

from cozygpu.model.tenants import ReleaseRef, ancestry, is_tenant_namespace, parent_namespace, tenant_release


@pytest.mark.parametrize(
    ("namespace", "parent"),
    [
        ("tenant-root", None),
        ("tenant-a", "tenant-root"),
        ("tenant-a-b", "tenant-a"),
        ("tenant-a-b-c", "tenant-a-b"),
        ("kube-system", None),
        ("cozy-kubevirt", None),
        ("tenant-", None),
        ("tenant-a--b", None),
        ("tenants", None),
    ],
)
def test_the_parent_of_a_tenant_namespace_drops_its_last_segment(namespace: str, parent: str | None) -> None:
    assert parent_namespace(namespace) == parent


def test_ancestry_runs_from_the_namespace_itself_up_to_tenant_root() -> None:
    assert ancestry("tenant-a-b-c") == ("tenant-a-b-c", "tenant-a-b", "tenant-a", "tenant-root")
    assert ancestry("tenant-root") == ("tenant-root",)


def test_a_namespace_without_the_tenant_prefix_belongs_to_no_tenant() -> None:
    assert ancestry("default") == ()
    assert not is_tenant_namespace("default")
    assert tenant_release("default") is None


@pytest.mark.parametrize(
    ("namespace", "release"),
    [
        ("tenant-root", ReleaseRef(name="tenant-root", namespace="tenant-root")),
        ("tenant-foo", ReleaseRef(name="tenant-foo", namespace="tenant-root")),
        ("tenant-foo-bar", ReleaseRef(name="tenant-bar", namespace="tenant-foo")),
        ("tenant-foo-bar-baz", ReleaseRef(name="tenant-baz", namespace="tenant-foo-bar")),
    ],
)
def test_a_tenant_release_is_named_after_the_last_segment_and_lives_in_the_parent(
    namespace: str, release: ReleaseRef
) -> None:
    assert tenant_release(namespace) == release
