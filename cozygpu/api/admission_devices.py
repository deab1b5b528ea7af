"""The GPUDevice fields admission reads: an order's class and count, its finalizers, and the bind handshake.

The model's full view of a device is ``cozygpu.views.decode.device_view``;
these readers are for what the webhooks read from a request's object or a
device just read from the API, where a malformed field must not raise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from cozygpu.api.meta import metadata, spec, status
from cozygpu.api.times import parse_time
from cozygpu.api.values import array_or_none, mapping, mapping_or_none, string, whole
from cozygpu.model.snapshot import Attachment, BindAnswer


@attrs.frozen
class Order:
    """What a GPUDevice orders: ``count`` GPUs of ``class_name``."""

    class_name: str
    count: int


def order(device: Mapping[str, Any]) -> Order | None:
    """``spec.className`` (a non-empty string) and ``spec.count`` (an integer); None when either is not one."""
    fields = spec(device)
    class_name, count = string(fields.get("className")), whole(fields.get("count"))
    return Order(class_name, count) if class_name and count is not None else None


def finalizer_list(device: Mapping[str, Any]) -> Sequence[Any] | None:
    """``metadata.finalizers`` as sent, None when missing or not a list (a patch must create it)."""
    return array_or_none(metadata(device).get("finalizers"))


def attachment(device: Mapping[str, Any]) -> Attachment | None:
    """``status.attachment`` (None when missing or not an object; its ``vmi`` may be "")."""
    found = mapping_or_none(status(device).get("attachment"))
    if found is None:
        return None
    return Attachment(vmi=string(found.get("vmi")), uid=string(found.get("uid")),
                      attached_at=parse_time(found.get("attachedAt")), request_id=string(found.get("requestId")))


def answer_id(device: Mapping[str, Any]) -> str:
    """``status.bindAnswer.id`` ("" when none): what a waiter compares on every device event, at the cost of
    a few lookups (the whole answer is decoded once it is this waiter's)."""
    return string(mapping(status(device).get("bindAnswer")).get("id"))


def bind_answer(device: Mapping[str, Any]) -> BindAnswer | None:
    """``status.bindAnswer`` (None when missing or not an object; its ``id`` may be "")."""
    found = mapping_or_none(status(device).get("bindAnswer"))
    if found is None:
        return None
    return BindAnswer(id=string(found.get("id")), result=string(found.get("result")),
                      reason=string(found.get("reason")), message=string(found.get("message")),
                      node=string(found.get("node")), time=parse_time(found.get("time")))
