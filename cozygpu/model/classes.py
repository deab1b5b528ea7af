"""Per-class rules and defaults: maxCount resolution, entitlement, positive durations (R-MOD-11).

Why: ``spec.maxCount`` has no schema default because the default depends on
the mode (1 for VGPU, unlimited for Passthrough), which a structural default
cannot express; every reader resolves it here. VGPU classes need an
entitlement label that is inherited down the tenant tree.

Contract: :func:`max_count` returns None for "no limit". :func:`entitled`
walks the tenant ancestry (a non-tenant namespace is judged on its own
label). :func:`positive` refuses a non-positive duration, since a zero
attachment grace would clear every attachment before its VMI appears.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from cozygpu import keys
from cozygpu.model import refusals
from cozygpu.model.refusals import Refusal
from cozygpu.model.snapshot import GPUClassView, Mode, NamespaceView
from cozygpu.model.tenants import ancestry

#: maxCount of a VGPU class that sets none.
VGPU_DEFAULT_MAX_COUNT = 1


def max_count(gpu_class: GPUClassView) -> int | None:
    """The most GPUs one GPUDevice of this class may order; None means unlimited."""
    if gpu_class.max_count is not None:
        return gpu_class.max_count
    return VGPU_DEFAULT_MAX_COUNT if gpu_class.mode is Mode.VGPU else None


def entitled(namespace: str, namespaces: Mapping[str, NamespaceView]) -> bool:
    """The namespace, or a tenant ancestor of it, carries the VGPU entitlement label."""
    chain = ancestry(namespace) or (namespace,)
    for name in chain:
        view = namespaces.get(name)
        if view is not None and view.labels.get(keys.VGPU_ENTITLED_LABEL) == keys.VGPU_ENTITLED_VALUE:
            return True
    return False


def entitlement_problem(
    gpu_class: GPUClassView, namespace: str, namespaces: Mapping[str, NamespaceView]
) -> Refusal | None:
    if gpu_class.mode is not Mode.VGPU or entitled(namespace, namespaces):
        return None
    return refusals.not_entitled(gpu_class.name, namespace, label=keys.VGPU_ENTITLED_LABEL)


def count_problem(gpu_class: GPUClassView, count: int) -> Refusal | None:
    """An order of ``count`` GPUs of this class on one GPUDevice: at least 1, at most maxCount."""
    if count < 1:
        return refusals.invalid_count(gpu_class.name, count)
    limit = max_count(gpu_class)
    if limit is not None and count > limit:
        return refusals.max_count_exceeded(gpu_class.name, max_count=limit, requested=count)
    return None


def positive(value: timedelta, *, name: str) -> timedelta:
    """A duration setting that must be greater than zero (attachment grace, bind wait)."""
    if value <= timedelta(0):
        raise ValueError(f"{name} must be positive, not {value}")
    return value
