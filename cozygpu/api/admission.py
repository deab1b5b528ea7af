"""An ``admission.k8s.io/v1`` AdmissionReview: its request read once into a typed value, and its response built.

The envelope (``cozygpu.admission.envelope``) decides what is a bad review
and says so; this module only reads and writes the fields. Reading never
raises: a missing or mistyped field reads as empty ("" / False / None).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from cozygpu.api.meta import EMPTY
from cozygpu.api.values import mapping, mapping_or_none, string

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"


@attrs.frozen(kw_only=True)
class Review:
    """An AdmissionReview's top level, as sent: the envelope checks its type before reading the request."""

    #: ``apiVersion`` and ``kind`` as written (any JSON value), for the envelope's check and message.
    api_version: object
    kind: object
    #: ``request`` when it is an object, else None.
    request: Mapping[str, Any] | None

    @property
    def is_v1(self) -> bool:
        return self.api_version == API_VERSION and self.kind == KIND


def review(body: Mapping[str, Any]) -> Review:
    """The top level of a parsed AdmissionReview body."""
    return Review(api_version=body.get("apiVersion"), kind=body.get("kind"),
                  request=mapping_or_none(body.get("request")))


@attrs.frozen(kw_only=True)
class AdmissionRequest:
    """The parts of an AdmissionReview request the webhooks read."""

    uid: str
    operation: str
    namespace: str
    name: str
    #: The object as sent (the webhooks read it through the ``cozygpu.api`` readers).
    object: Mapping[str, Any]
    #: ``oldObject`` on an UPDATE or DELETE; None on a CREATE.
    old_object: Mapping[str, Any] | None = None
    dry_run: bool
    #: ``kind.kind`` (the object's kind) and ``userInfo.username``.
    kind: str
    user: str


def request_uid(request: Mapping[str, Any]) -> str:
    """``request.uid`` ("" when missing or not a string): the envelope checks it before the rest is read."""
    return string(request.get("uid"))


def request_object(request: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``request.object`` when it is an object, else None."""
    return mapping_or_none(request.get("object"))


def admission_request(request: Mapping[str, Any]) -> AdmissionRequest:
    """The typed request (an absent object reads as empty: the envelope refuses that before it asks)."""
    return AdmissionRequest(
        uid=request_uid(request),
        operation=string(request.get("operation")),
        namespace=string(request.get("namespace")),
        name=string(request.get("name")),
        object=request_object(request) or EMPTY,
        old_object=mapping_or_none(request.get("oldObject")),
        dry_run=request.get("dryRun") is True,
        kind=string(mapping(request.get("kind")).get("kind")),
        user=string(mapping(request.get("userInfo")).get("username")),
    )


def response(uid: str, *, allowed: bool, code: int = 0, reason: str = "", message: str = "", warning: str = "",
             patch: str = "") -> dict[str, Any]:
    """The AdmissionReview v1 response: a refusal's ``status`` (``code``, ``reason``, ``message``) when not
    ``allowed``; a ``warning`` and a base64 JSONPatch ``patch`` when allowed (each only when given)."""
    answer: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        answer["status"] = {"code": code, "reason": reason, "message": message}
    else:
        if warning:
            answer["warnings"] = [warning]
        if patch:
            answer["patchType"] = "JSONPatch"
            answer["patch"] = patch
    return {"apiVersion": API_VERSION, "kind": KIND, "response": answer}
