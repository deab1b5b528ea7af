"""Which pod is a VMI's launcher (R-MOD-5).

Why: the units a VMI's devices hold are left out of its launcher pod's GPU
usage. Owner references and labels are written by whoever creates the pod,
so matching on them would let any pod that names a VMI with attached devices
hide its GPUs from capacity, raw-key budgets and the usage records.

Contract: a pod is a VMI's launcher only when that VMI, in the pod's own
namespace, lists the pod's UID in ``status.activePods`` (virt-controller
writes it; no tenant role can). Any other pod's GPUs are raw-name usage.
This is the one reader every caller uses. Note that ``activePods`` also
holds a migration target pod and, until deletion, a finished source pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from cozygpu.model.snapshot import PodView, VmiKey, VMIView


def launcher_index(vmis: Iterable[VMIView]) -> dict[str, VmiKey]:
    """Pod UID -> the VMI that lists it as active."""
    index: dict[str, VmiKey] = {}
    for vmi in vmis:
        for uid in vmi.active_pods:
            index[uid] = vmi.key
    return index


def launcher_vmi(pod: PodView, launchers: Mapping[str, VmiKey]) -> VmiKey | None:
    """The VMI this pod launches, or None when the pod is not a launcher (its GPUs are raw-name usage)."""
    if not pod.uid:
        return None
    vmi = launchers.get(pod.uid)
    if vmi is None or vmi[0] != pod.namespace:
        return None
    return vmi


def is_launcher(pod: PodView, vmi: VMIView) -> bool:
    return bool(pod.uid) and pod.namespace == vmi.namespace and pod.uid in vmi.active_pods
