from __future__ import annotations

from datetime import timedelta

import pytest

from cozygpu.model.classes import entitled, max_count, positive
from cozygpu.model.snapshot import Mode
from tests.model.factories import gpu_class, namespaces


def test_an_unset_max_count_is_one_for_vgpu_and_unlimited_for_passthrough() -> None:
    assert max_count(gpu_class(mode=Mode.VGPU)) == 1
    assert max_count(gpu_class(mode=Mode.PASSTHROUGH)) is None
    assert max_count(gpu_class(mode=Mode.VGPU, max_count=4)) == 4
    assert max_count(gpu_class(mode=Mode.PASSTHROUGH, max_count=2)) == 2


def test_the_vgpu_entitlement_is_inherited_down_the_tenant_tree_and_not_up() -> None:
    views = {n.name: n for n in namespaces("tenant-root", "tenant-a", "tenant-a-b", "tenant-c", entitled=["tenant-a"])}
    assert entitled("tenant-a-b", views)
    assert entitled("tenant-a", views)
    assert not entitled("tenant-root", views)
    assert not entitled("tenant-c", views)


def test_a_non_tenant_namespace_is_judged_on_its_own_label() -> None:
    views = {n.name: n for n in namespaces("gpu-lab", entitled=["gpu-lab"])}
    assert entitled("gpu-lab", views)
    assert not entitled("other", views)


def test_a_grace_period_must_be_positive() -> None:
    assert positive(timedelta(minutes=2), name="attachment grace") == timedelta(minutes=2)
    with pytest.raises(ValueError, match="attachment grace must be positive"):
        positive(timedelta(0), name="attachment grace")
