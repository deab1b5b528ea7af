"""One exception tree for every error that crosses the API boundary.

    KubeError
    ├── ApiError                 the server answered with a failure Status
    │   ├── BadRequest           400
    │   ├── Unauthorized         401
    │   ├── Forbidden            403 (RBAC, or an admission webhook/policy refusal)
    │   ├── NotFound             404
    │   ├── Conflict             409 reason Conflict: a resourceVersion precondition failed
    │   ├── AlreadyExists        409 reason AlreadyExists
    │   ├── Gone                 410: a watch or list resourceVersion is too old (relist)
    │   ├── Invalid              422 (schema, CEL, a refused admission answer with that code)
    │   ├── TooManyRequests      429 (retried with Retry-After)
    │   └── ServerError          5xx
    ├── Unavailable              no answer: connection refused or reset, timeout
    └── ConfigError              no usable client configuration (kubeconfig or in-cluster)

Low-level errors (aiohttp, asyncio timeouts, OS errors) are mapped into this
tree in ``client.py`` and nowhere else, so callers catch our names only;
configuration errors (kubernetes-asyncio's ``ConfigException``, yaml errors)
are mapped in ``config.py``.
"""

from __future__ import annotations

from typing import Any


class KubeError(Exception):
    """Base of every error raised by cozygpu.kube."""


class Unavailable(KubeError):
    """The API server could not be reached or did not answer in time."""


class ConfigError(KubeError):
    """The client cannot be configured: which kubeconfig (or in-cluster file) and what is wrong, in one line."""


class ApiError(KubeError):
    status: int = 0

    def __init__(self, status: int, body: dict[str, Any] | None, *, method: str = "", path: str = "") -> None:
        self.status = status
        self.body = body or {}
        self.reason: str = str(self.body.get("reason", ""))
        self.message: str = str(self.body.get("message", "")) or f"HTTP {status}"
        self.details: dict[str, Any] = self.body.get("details") or {}
        self.method = method
        self.path = path
        super().__init__(f"{method} {path}: {status} {self.reason}: {self.message}".strip())

    @property
    def causes(self) -> list[dict[str, Any]]:
        return list(self.details.get("causes") or [])


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Forbidden(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    pass


class Fenced(Conflict):
    """A write never sent: the client's fence said its writer may not write now (a leader past its term).

    A Conflict, so a caller drops the write as it drops one refused on its
    resourceVersion; nothing reached the API server.
    """

    def __init__(self, why: str, *, method: str = "", path: str = "") -> None:
        super().__init__(409, {"reason": "Fenced", "message": f"not sent: {why}"}, method=method, path=path)


class AlreadyExists(ApiError):
    pass


class Gone(ApiError):
    pass


class Invalid(ApiError):
    pass


class TooManyRequests(ApiError):
    def __init__(self, status: int, body: dict[str, Any] | None, *, retry_after: float | None = None,
                 method: str = "", path: str = "") -> None:
        super().__init__(status, body, method=method, path=path)
        self.retry_after = retry_after


class ServerError(ApiError):
    pass


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def error_for(status: int, body: dict[str, Any] | None, *, method: str = "", path: str = "",
              retry_after: float | None = None) -> ApiError:
    """Map an HTTP failure and its Status body to the exception tree."""
    if status == 409:
        reason = (body or {}).get("reason")
        cls409 = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls409(status, body, method=method, path=path)
    if status == 429:
        return TooManyRequests(status, body, retry_after=retry_after, method=method, path=path)
    if status >= 500:
        return ServerError(status, body, method=method, path=path)
    cls = _BY_STATUS.get(status, ApiError)
    return cls(status, body, method=method, path=path)
