"""Scraping a controller's ``/metrics`` as Prometheus would: HTTPS, with a service account's bearer token.

- ``metrics_reader_token`` binds the chart's ``cozygpu-metrics-reader``
  ClusterRole (rendered by helm) to a service account of the test's
  namespace, waits until the API server's authorizer says so, and mints its
  token;
- ``scrape`` GETs a running controller's ``/metrics`` with a token (or
  none), trusting ``context`` (None: no verification, as the chart's default
  ServiceMonitor does with the self-signed certificate).
"""

from __future__ import annotations

import asyncio
import ssl

import aiohttp

from cozygpu.devcluster import apply, replicas
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client, resource_path, reviews
from cozygpu.runtime.controller import Controller
from tests.support.waiting import eventually

RBAC = "rbac.authorization.k8s.io"


async def allowed_to_scrape(admin: Client, user: str) -> bool:
    answer = await reviews.review_access(admin, reviews.User(user, groups=("system:serviceaccounts",)),
                                         path="/metrics", verb="get", timeout=10)
    return answer.allowed


async def metrics_reader_token(plane: ControlPlane, admin: Client, namespace: str, account: str = "scraper") -> str:
    """A token of ``namespace/account``, bound (by a binding of the test's own) to the chart's metrics-reader role."""
    rendered = await asyncio.to_thread(replicas.metrics_reader_rbac, namespace, account)
    await apply.apply_objects(admin, [obj for obj in rendered if obj["kind"] == "ClusterRole"])
    await admin.create(resource_path(RBAC, "v1", "clusterrolebindings"), {
        "metadata": {"name": f"{namespace}-{account}-metrics-reader"},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": replicas.METRICS_READER},
        "subjects": [{"kind": "ServiceAccount", "namespace": namespace, "name": account}],
    })
    token = await plane.service_account_token(admin, namespace=namespace, service_account=account)
    user = f"system:serviceaccount:{namespace}:{account}"

    async def allowed() -> bool:  # the authorizer's RBAC cache follows the binding shortly
        return await allowed_to_scrape(admin, user)

    await eventually(allowed, interval=0.1, what=f"{user} allowed get on /metrics by the chart's ClusterRole")
    return token


def metrics_url(controller: Controller) -> str:
    return f"https://127.0.0.1:{controller.bound['metrics'].port}/metrics"


async def scrape(controller: Controller, token: str | None, *,
                 context: ssl.SSLContext | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as session, \
            session.get(metrics_url(controller), headers=headers, ssl=context if context else False) as resp:
        return resp.status, await resp.text()
