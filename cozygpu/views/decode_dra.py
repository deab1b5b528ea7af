"""Decode the DRA objects the model reads (``resource.k8s.io/v1``): ResourceSlices, DeviceTaintRules,
DeviceClasses' selectors and ResourceClaims (SPEC §1.5).

Contract: as ``cozygpu.views.decode``'s: pure functions of JSON mappings, never mutated; an object that
cannot be read raises ``InvalidObject``.
"""

from __future__ import annotations

from cozygpu import keys
from cozygpu.model.cel import CelError, DeviceAttrs
from cozygpu.model.dra import ClaimView, DeviceRef, SliceDevice, SliceView, TaintRule
from cozygpu.views.decode import InvalidObject, Obj, as_int, as_list, as_map, as_str, is_map


def resource_slice_view(obj: Obj) -> SliceView:
    """A ResourceSlice (``resource.k8s.io/v1``): its pool, node and devices; a device whose attributes or
    capacity cannot be read is kept with why (a selector cannot match it, as in the allocator)."""
    meta, spec = as_map(obj.get("metadata")), as_map(obj.get("spec"))
    driver, pool = as_str(spec.get("driver")), as_map(spec.get("pool"))
    if not driver or not as_str(pool.get("name")):
        raise InvalidObject("a ResourceSlice needs spec.driver and spec.pool.name")
    devices: list[SliceDevice] = []
    for device in as_list(spec.get("devices")):
        if not is_map(device) or not as_str(device.get("name")):
            continue
        taint = next((f"{as_str(t.get('key'))}={as_str(t.get('value'))}:{t.get('effect')}"
                      for t in as_list(device.get("taints")) if is_map(t)
                      and t.get("effect") in ("NoSchedule", "NoExecute")), "")
        try:
            devices.append(SliceDevice(name=device["name"], attrs=DeviceAttrs.from_slice_device(driver, device),
                                       taint=taint))
        except CelError as error:
            devices.append(SliceDevice(name=device["name"], attrs=None, problem=str(error), taint=taint))
    return SliceView(name=as_str(meta.get("name")), driver=driver, pool=as_str(pool.get("name")),
                     generation=as_int(pool.get("generation")) or 0,
                     slice_count=as_int(pool.get("resourceSliceCount")) or 1,
                     node=as_str(spec.get("nodeName")), devices=tuple(devices))


def device_taint_rule_view(obj: Obj) -> TaintRule | None:
    """A DeviceTaintRule (``resource.k8s.io/v1``, 1.37): None when it keeps nothing off its devices (effect
    ``None``, or no selector: a rule without one selects no device)."""
    meta, spec = as_map(obj.get("metadata")), as_map(obj.get("spec"))
    taint, selector = as_map(spec.get("taint")), spec.get("deviceSelector")
    if taint.get("effect") not in ("NoSchedule", "NoExecute") or not is_map(selector):
        return None

    def field(name: str) -> str | None:
        value = selector.get(name)
        return value if isinstance(value, str) else None

    return TaintRule(name=as_str(meta.get("name")),
                     taint=f"{as_str(taint.get('key'))}={as_str(taint.get('value'))}:{taint.get('effect')}",
                     driver=field("driver"), pool=field("pool"), device=field("device"))


def device_class_selectors(obj: Obj) -> tuple[str, ...]:
    """A DeviceClass's CEL selectors (``spec.selectors[].cel.expression``), in order; a selector of another
    kind is refused (the allocator would not know it either)."""
    out: list[str] = []
    for at, selector in enumerate(as_list(as_map(obj.get("spec")).get("selectors"))):
        expression = as_map(as_map(selector).get("cel")).get("expression")
        if not isinstance(expression, str):
            raise InvalidObject(f"selector {at} of the DeviceClass has no cel.expression")
        out.append(expression)
    return tuple(out)


def resource_claim_view(obj: Obj) -> ClaimView:
    """A ResourceClaim: the devices its allocation holds, the allocation's node, and the GPUDevice that
    owns it (its controller reference of our group), if one does."""
    meta, status = as_map(obj.get("metadata")), as_map(obj.get("status"))
    allocation = as_map(status.get("allocation"))
    allocated = tuple(
        DeviceRef(as_str(result.get("driver")), as_str(result.get("pool")), as_str(result.get("device")))
        for result in as_list(as_map(allocation.get("devices")).get("results")) if is_map(result))
    names = {value for term in as_list(as_map(allocation.get("nodeSelector")).get("nodeSelectorTerms"))
             if is_map(term) for field in as_list(term.get("matchFields"))
             if is_map(field) and field.get("key") == "metadata.name" and field.get("operator") == "In"
             for value in as_list(field.get("values")) if isinstance(value, str)}
    holder = next((as_str(ref.get("name")) for ref in as_list(meta.get("ownerReferences"))
                   if is_map(ref) and ref.get("controller") is True and ref.get("kind") == keys.GPUDEVICE_KIND
                   and ref.get("apiVersion") == keys.API_VERSION), "")
    return ClaimView(namespace=as_str(meta.get("namespace")), name=as_str(meta.get("name")), allocated=allocated,
                     node=next(iter(names)) if len(names) == 1 else "", holder=holder)
