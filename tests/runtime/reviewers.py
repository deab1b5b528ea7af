"""A fake of the API server's TokenReview and SubjectAccessReview, for tests of ``/metrics`` without a cluster."""

from __future__ import annotations

import asyncio

from cozygpu.kube import errors, reviews


class FakeReviewer:
    """Knows ``users`` by token and allows the names in ``allowed``; records every question asked.

    ``failure``, when set, is raised by the next questions instead of an answer
    (``access_failure`` by the access reviews only);
    ``gate``, when set, holds every question until it is set (to count how many
    are asked at once).
    """

    def __init__(self, users: dict[str, str] | None = None, allowed: set[str] | None = None) -> None:
        self.users = dict(users or {})
        self.allowed = set(allowed or ())
        self.asked: list[str] = []
        self.failure: errors.KubeError | None = None
        self.access_failure: errors.KubeError | None = None
        self.evaluation_error = ""
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.most_in_flight = 0

    async def _through_gate(self) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
        finally:
            self.in_flight -= 1
        if self.failure is not None:
            raise self.failure

    async def token(self, token: str) -> reviews.TokenAnswer:
        self.asked.append("token")
        await self._through_gate()
        name = self.users.get(token)
        if name is None:
            return reviews.TokenAnswer(None, "invalid bearer token")
        return reviews.TokenAnswer(reviews.User(name, uid=f"uid-{name}", groups=("system:authenticated",)))

    async def access(self, user: reviews.User) -> reviews.AccessAnswer:
        self.asked.append("access")
        await self._through_gate()
        if self.access_failure is not None:
            raise self.access_failure
        if user.name in self.allowed:
            return reviews.AccessAnswer(True, "allowed by the test")
        return reviews.AccessAnswer(False, "", self.evaluation_error)
