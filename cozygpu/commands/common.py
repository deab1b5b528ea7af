"""What every command for people shares: the cluster flags, one read of the cluster, one way to fail.

Why: ``catalog``, ``status`` and ``why`` must answer from the same snapshot
the binder and the webhooks build, and must fail the same way: a bad
kubeconfig, an unreachable server or a refused read is one line on stderr
naming what was wrong and exit code 1, never a traceback (bad flags are
argparse's exit 2).

Contract:
- :func:`read_cluster` lists every kind the model reads (KubeVirt and DRA kinds that
  are not served read as absent), the leader Lease and the settings
  ConfigMap, wherever the controller runs (found by name across
  namespaces), and builds the model's snapshot from them. The hoster's GPU
  resource names default to what the controller published in the settings
  ConfigMap (R-BIND-10), so the effective set is the binder's.
- :func:`run` runs a command's coroutine and maps every ``KubeError`` to
  its one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import attrs

from cozygpu import keys
from cozygpu.cache.kinds import KindSpec
from cozygpu.kube import Client, errors, resource_path
from cozygpu.kube.config import source_for
from cozygpu.model.snapshot import Snapshot
from cozygpu.views import specs
from cozygpu.views.build import build_snapshot

Obj = dict[str, Any]

#: Seconds for one request: a person waits for the answer, a controller's 30 s is too long.
REQUEST_TIMEOUT: Final = 15.0

LEASES: Final = resource_path("coordination.k8s.io", "v1", "leases")
CONFIGMAPS: Final = resource_path("", "v1", "configmaps")


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    parser.add_argument("--gpu-resource-names", default=None,
                        help="the hoster's GPU resource names, comma-separated (default: those the controller "
                             "published in its settings ConfigMap)")


async def connect(args: argparse.Namespace) -> Client:
    return await Client.from_kubeconfig(args.kubeconfig, context=args.context, user_agent="cozygpu-cli",
                                        default_timeout=REQUEST_TIMEOUT)


@attrs.frozen(kw_only=True)
class Cluster:
    """One read of the cluster: the raw objects a command shows, and the model's snapshot of them."""

    snapshot: Snapshot
    classes: Mapping[str, Obj]
    devices: Mapping[tuple[str, str], Obj]
    gpunodes: Mapping[str, Obj]
    #: The leader Lease, None when no controller ever led.
    lease: Obj | None
    settings: Obj | None
    vmis_served: bool
    now: datetime


async def _list(client: Client, spec: KindSpec) -> list[Obj] | None:
    """The kind's objects; None when the kind is not served (KubeVirt not installed)."""
    try:
        answer = await client.list_objects(spec.path, params=spec.selector_params())
    except errors.NotFound:
        return None
    items: list[Obj] = answer.get("items", [])
    return items


async def _named(client: Client, path: str, name: str) -> Obj | None:
    """The object of this name in whichever namespace holds it (the controller's); the oldest if several."""
    answer = await client.list_objects(path, params={"fieldSelector": f"metadata.name={name}"})
    items: list[Obj] = answer.get("items", [])
    items.sort(key=lambda o: str(o["metadata"].get("creationTimestamp") or ""))
    return items[0] if items else None


def published_names(settings: Obj | None) -> list[str]:
    raw = ((settings or {}).get("data") or {}).get(keys.SETTINGS_RESOURCE_NAMES) or "[]"
    try:
        names = json.loads(raw)
    except ValueError:
        return []
    return [str(n) for n in names] if isinstance(names, list) else []


async def read_cluster(client: Client, *, hoster_names: Sequence[str] | None = None) -> Cluster:
    kinds = (specs.GPU_CLASSES, specs.GPU_DEVICES, specs.GPU_NODES, specs.NODES, specs.PODS, specs.VMIS,
             specs.TENANT_QUOTAS, specs.NAMESPACES, specs.KUBEVIRTS, specs.RESOURCE_SLICES, specs.DEVICE_CLASSES,
             specs.RESOURCE_CLAIMS, specs.DEVICE_TAINT_RULES)
    try:
        async with asyncio.TaskGroup() as group:
            listing = [group.create_task(_list(client, spec)) for spec in kinds]
            lease_task = group.create_task(_named(client, LEASES, keys.LEADER_LEASE))
            settings_task = group.create_task(_named(client, CONFIGMAPS, keys.SETTINGS_CONFIGMAP))
    except ExceptionGroup as failed:
        raise first_error(failed) from None
    (classes, devices, gpunodes, nodes, pods, vmis, quotas, namespaces, kubevirts, slices, device_classes,
     claims, taint_rules) = (t.result() for t in listing)
    settings = settings_task.result()
    names = list(hoster_names) if hoster_names is not None else published_names(settings)
    now = datetime.now(UTC)
    snapshot = build_snapshot(
        now=now, classes=classes or (), devices=devices or (), gpunodes=gpunodes or (), nodes=nodes or (),
        pods=pods or (), vmis=vmis or (), quotas=quotas or (), namespaces=namespaces or (),
        kubevirts=kubevirts or (), slices=slices or (), device_classes=device_classes or (), claims=claims or (),
        taint_rules=taint_rules or (), hoster_names=names,
    )
    return Cluster(
        snapshot=snapshot,
        classes={o["metadata"]["name"]: o for o in classes or ()},
        devices={(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in devices or ()},
        gpunodes={o["metadata"]["name"]: o for o in gpunodes or ()},
        lease=lease_task.result(), settings=settings, vmis_served=vmis is not None, now=now,
    )


def first_error(group: BaseExceptionGroup[Exception]) -> Exception:
    """The first error of a task group's failure (the one to tell a person; the others are alike)."""
    first = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


def hoster_names(args: argparse.Namespace) -> list[str] | None:
    if args.gpu_resource_names is None:
        return None
    return [name for name in args.gpu_resource_names.split(",") if name]


async def events_of(client: Client, namespace: str, kind: str, name: str, uid: str = "") -> list[Obj]:
    """The core/v1 Events about one object, oldest first."""
    selector = f"involvedObject.kind={kind},involvedObject.name={name}"
    if uid:
        selector += f",involvedObject.uid={uid}"
    answer = await client.list_objects(resource_path("", "v1", "events", namespace=namespace),
                                       params={"fieldSelector": selector})
    items: list[Obj] = answer.get("items", [])
    items.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or
                                 e["metadata"].get("creationTimestamp") or ""))
    return items


def run(prog: str, args: argparse.Namespace, body: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]) -> int:
    """Run ``body(args)``; every error of the API boundary is one line on stderr and exit code 1."""
    try:
        return asyncio.run(body(args))
    except errors.ConfigError as err:
        print(f"{prog}: {err}", file=sys.stderr)
    except errors.Unavailable as err:
        where = source_for(getattr(args, "kubeconfig", None)).describe()
        print(f"{prog}: cannot reach the API server ({where}): {err}", file=sys.stderr)
    except errors.Unauthorized as err:
        print(f"{prog}: the API server does not accept these credentials: {err}", file=sys.stderr)
    except errors.KubeError as err:
        print(f"{prog}: {err}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return 1


def age(when: datetime | None, now: datetime) -> str:
    """How long ago ``when`` was, as kubectl shows ages; ``-`` when unknown."""
    return "-" if when is None else duration((now - when).total_seconds())


def duration(seconds: float | None) -> str:
    """``5s``, ``3m``, ``2h``, ``4d`` (kubectl's style); ``-`` when unknown."""
    if seconds is None:
        return "-"
    whole = max(int(seconds), 0)
    if whole < 120:
        return f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m"
    if whole < 172800:
        return f"{whole // 3600}h"
    return f"{whole // 86400}d"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, three spaces apart; the last column unpadded."""
    lines = [list(headers), *[list(r) for r in rows]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers) - 1)]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)) + "   " + line[-1]
        for line in lines
    ).rstrip()
