"""Transforms: shrink an object before it is stored, so the cache keeps only what someone reads.

A transform runs once per object, on the freshly decoded JSON dict of a list
item or a watch event, before the object is frozen and stored. It owns that
dict: it may change it in place and return it, or return a new one. It must
keep ``metadata.name``, ``metadata.namespace``, ``metadata.uid`` and
``metadata.resourceVersion`` (the store and the resourceVersion proofs rely on
them), and must be a pure function of the object (a relist reuses stored
objects whose resourceVersion did not change, without transforming again).

Every kind gets ``strip_metadata`` (managedFields and the last-applied
annotation are often half an object's size and no reader wants them). Pods
dominate memory (a launcher pod is mostly environment, volumes and status), so
``slim_pod`` keeps an explicit list of the fields the model reads (R-MOD-4,
R-MOD-5, R-MOD-6); a reader that needs another pod field adds it here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

from cozygpu import keys

Obj = dict[str, Any]
Transform = Callable[[Obj], Obj]

LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
#: Pod annotations kept by ``slim_pod``.
OWN_ANNOTATION_PREFIX: Final = f"{keys.GROUP}/"

#: Pod fields kept by ``slim_pod``: these of metadata (every field of v1 ObjectMeta but
#: managedFields, and of annotations only cozygpu's own), and these of spec, containers and status.
POD_METADATA_FIELDS: Final = (
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers",
)
POD_SPEC_FIELDS: Final = ("nodeName", "overhead", "resources", "schedulerName", "priority")
POD_CONTAINER_FIELDS: Final = ("name", "resources", "restartPolicy")
POD_STATUS_FIELDS: Final = ("phase",)

#: Node status fields dropped by ``slim_node`` (large, and read by nobody here).
NODE_STATUS_DROPPED: Final = ("images", "volumesInUse", "volumesAttached", "daemonEndpoints", "config")


def strip_metadata(obj: Obj) -> Obj:
    """Drop ``metadata.managedFields`` and the last-applied-configuration annotation."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            del annotations[LAST_APPLIED]
            if not annotations:
                del meta["annotations"]
    return obj


def _dict(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def _pick(source: Any, fields: Iterable[str]) -> Obj:
    if not isinstance(source, dict):
        return {}
    return {key: source[key] for key in fields if key in source}


def own_annotations(annotations: dict[str, Any]) -> Obj:
    """The annotations of cozygpu's own group, the only ones ``slim_pod`` keeps."""
    return {key: value for key, value in annotations.items() if key.startswith(OWN_ANNOTATION_PREFIX)}


def slim_pod(pod: Obj) -> Obj:
    """A pod reduced to what GPU accounting reads: identity, owners, node, phase, container resources.

    Kept: metadata (the fields of ``POD_METADATA_FIELDS``: all of ObjectMeta
    but managedFields) with only the annotations of cozygpu's own group (a
    launcher pod carries the VMI's, and nobody here reads them from the pod);
    ``spec.nodeName``, ``overhead``,
    pod-level ``resources``, ``schedulerName``, ``priority``; for every container,
    and init container: ``name``, ``resources``,
    ``restartPolicy`` (an init container with ``restartPolicy: Always`` is a
    sidecar, R-MOD-4); ``status.phase``.
    """
    meta = _pick(pod.get("metadata"), POD_METADATA_FIELDS)
    annotations = meta.get("annotations")
    if isinstance(annotations, dict):
        ours = own_annotations(annotations)
        if ours:
            meta["annotations"] = ours
        else:
            del meta["annotations"]
    spec = pod.get("spec")
    slim_spec = _pick(spec, POD_SPEC_FIELDS)
    if isinstance(spec, dict):
        for key in ("containers", "initContainers"):
            containers = spec.get(key)
            if isinstance(containers, list):
                slim_spec[key] = [_pick(c, POD_CONTAINER_FIELDS) for c in containers]
    out: Obj = {"metadata": meta, "spec": slim_spec}
    status = _pick(pod.get("status"), POD_STATUS_FIELDS)
    if status:
        out["status"] = status
    for key in ("apiVersion", "kind"):
        if key in pod:
            out[key] = pod[key]
    return out


def slim_node(node: Obj) -> Obj:
    """A node without its image list, volume lists and other status nobody here reads."""
    strip_metadata(node)
    status = node.get("status")
    if isinstance(status, dict):
        for key in NODE_STATUS_DROPPED:
            status.pop(key, None)
    return node


def slim_crd(crd: Obj) -> Obj:
    """A CustomResourceDefinition reduced to what served-kind discovery reads (no schemas)."""
    strip_metadata(crd)
    spec = _dict(crd.get("spec"))
    versions = spec.get("versions")
    return {
        "metadata": crd.get("metadata", {}),
        "spec": {
            "group": spec.get("group"),
            "scope": spec.get("scope"),
            "names": _pick(spec.get("names"), ("plural", "kind")),
            "versions": [_pick(v, ("name", "served")) for v in versions] if isinstance(versions, list) else [],
        },
        "status": {"conditions": _dict(crd.get("status")).get("conditions") or []},
    }
