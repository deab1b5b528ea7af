"""Who holds a bearer token, and whether they may do something: TokenReview and SubjectAccessReview.

The two calls a server makes to delegate authentication and authorization to
the API server, as kube-rbac-proxy and controller-runtime's secure metrics do.

Contract:
- ``review_token`` POSTs an ``authentication.k8s.io/v1`` TokenReview with no
  audiences, so the API server checks the token against its own (a service
  account's projected token, as Prometheus mounts it, passes). Not
  authenticated is an answer (``authenticated`` False, with the API server's
  ``error``), never an exception.
- ``review_access`` POSTs an ``authorization.k8s.io/v1`` SubjectAccessReview
  for a non-resource URL and verb, as the user the TokenReview named (name,
  uid, groups, extra). Denied is an answer too.
- An answer the API server could not give (no connection, 5xx, 429, or the
  caller itself may not create reviews: 403) raises from ``errors``' tree;
  a caller must not read such a failure as a denial.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from cozygpu.kube.client import Client, resource_path

TOKEN_REVIEWS: Final = resource_path("authentication.k8s.io", "v1", "tokenreviews")
ACCESS_REVIEWS: Final = resource_path("authorization.k8s.io", "v1", "subjectaccessreviews")


@attrs.frozen
class User:
    """An authenticated user as the TokenReview names it."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)


@attrs.frozen
class TokenAnswer:
    """The TokenReview's status: the user when authenticated, else the API server's reason (may be empty)."""

    user: User | None
    error: str = ""

    @property
    def authenticated(self) -> bool:
        return self.user is not None


@attrs.frozen
class AccessAnswer:
    """The SubjectAccessReview's status.

    ``evaluation_error`` is set when an authorizer failed while deciding: the
    answer is still not-allowed, but it may change on a second ask.
    """

    allowed: bool
    reason: str = ""
    evaluation_error: str = ""


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(item) for item in value) if isinstance(value, list) else ()


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


async def review_token(client: Client, token: str, *, timeout: float) -> TokenAnswer:
    """Who ``token`` belongs to, asked of the API server (see the module contract)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
    answer = await client.create(TOKEN_REVIEWS, body, timeout=timeout, attempts=2)
    status = _mapping(answer.get("status"))
    user = _mapping(status.get("user"))
    if status.get("authenticated") is not True or not user.get("username"):
        return TokenAnswer(None, str(status.get("error") or ""))
    extra = {str(key): _strings(values) for key, values in _mapping(user.get("extra")).items()}
    return TokenAnswer(User(str(user["username"]), str(user.get("uid") or ""), _strings(user.get("groups")), extra))


async def review_access(client: Client, user: User, *, path: str, verb: str, timeout: float) -> AccessAnswer:
    """Whether ``user`` may ``verb`` the non-resource URL ``path``, asked of the API server."""
    spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups),
                            "nonResourceAttributes": {"path": path, "verb": verb}}
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {key: list(values) for key, values in user.extra.items()}
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
    answer = await client.create(ACCESS_REVIEWS, body, timeout=timeout, attempts=2)
    status = _mapping(answer.get("status"))
    return AccessAnswer(status.get("allowed") is True, str(status.get("reason") or ""),
                        str(status.get("evaluationError") or ""))

