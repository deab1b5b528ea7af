"""Admission bench: VMI starts as a client sees them (API server → webhook → binder → answer), and GPUDevice orders.

    python bench/bench_admission.py [--fleet] [--starts 200] [--burst 200] [--burst-count N] [--nodes N] [--orders 200]
    python bench/bench_admission.py --extreme [--repeat 5] [--nodes 50] [--orders 200]

Starts its own control plane (the project's envtest) with the CRDs and a
class, then runs the webhooks and a binder on its pass driver in this process
over one cache, registered with the API server by URL on loopback HTTPS, as
the tests do.

- Default: the fast plane (API server and etcd) and ``--nodes`` (50) plain
  Nodes of 8 units each, made Ready, with their GPUNode reports.
- ``--fleet``: the full plane (kube-controller-manager, kube-scheduler, kwok)
  and the 1,000-node kwok fleet of ``cozygpu.devcluster.nodes`` (``--nodes``
  defaults to 1,000), each Node serving 8 units of the class's resource name
  and held Ready by kwok, with a GPUNode report of 8 GPUs; the burst's starts
  take 8 GPUs each (``--burst-count``), a whole node, so a node booked twice
  shows in the final state as 16 units held on 8.

Figures, printed, never asserted, with the ratio to the target:

- VMI create latency, one start at a time (each VMI with one template device
  of one GPU): create sent → the API server's answer, p50/p99 over ``--starts``.
- A burst of ``--burst`` concurrent starts (one template of ``--burst-count``
  GPUs each): how many were admitted, the worst latency against the bind
  wait, and whether any node ended with more units held than it serves
  (double booking), read from the final state of every GPUDevice.
- GPUDevice admission: dry-run creates (the validating webhook runs, nothing
  is stored), p50/p99 over ``--orders``; and the same without the webhook
  registered, so the webhook's own share shows.

Targets: VMI admission p99 <= 150 ms, GPUDevice admission p99 <= 20 ms; the
burst within the bind wait (10 s).

``--extreme`` (issue 22, bounded admission; the fast plane, no starts or
burst): the worst case beside the typical one. Each extreme request is sent
``--repeat`` times, through the API server (dry runs: a VMI whose template
asks for 3,000,000 GPUs, 32 templates, 5,000 ``gpus`` entries, 10,000 refs
entries, 2,000 affinity terms; a GPUDevice of 2^31-1) and straight to the
webhook URL (what the API server would never send: 7 MiB of empty lists, JSON
nested 2,000 deep, a 7 MiB string, the 3,000,000 count, a launcher pod with
5,000 tolerations). Printed per case: its answer time, the time a one-unit
GPUDevice order sent to the same replica meanwhile waited, both against the
typical figure, and the longest the event loop was held (a 1 ms ticker's
worst lateness; the bench's own clients share that loop).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cozygpu.kube import Client, errors, resource_path  # noqa: E402

VMI_TARGET_S = 0.150
DEVICE_TARGET_S = 0.020
BIND_WAIT_S = 10.0
UNITS_PER_NODE = 8
FLEET_NODES = 1000
#: Connections of one client (cozygpu.kube.Client's pool).
TENANT_POOL = 64


def ratio(value: float, target: float) -> str:
    return f"{value / target:.2f}x of target ({'ok' if value <= target else 'OVER'})"


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


async def bounded(calls: list[object], limit: int = 32) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(call: object) -> None:
        async with gate:
            await call  # type: ignore[misc]

    await asyncio.gather(*(one(c) for c in calls))


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def timed(coro: object) -> tuple[float, object]:
    started = time.perf_counter()
    try:
        result = await coro  # type: ignore[misc]
    except errors.ApiError as error:
        result = error
    return time.perf_counter() - started, result


async def orders(admin: Client, namespace: str, class_name: str, count: int) -> list[float]:
    path = resource_path("gpu.cozystack.io", "v1alpha1", "gpudevices", namespace=namespace)
    figures = []
    for i in range(count):
        body = {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice", "metadata": {"name": f"o{i}"},
                "spec": {"className": class_name, "count": 1}}
        took, result = await timed(admin.create(path, body, dry_run=True))
        if isinstance(result, errors.ApiError):
            raise SystemExit(f"a dry-run order was refused: {result}")
        figures.append(took)
    return figures


class LoopLag:
    """The worst lateness of a 1 ms ticker on this loop: how long something held the loop."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - before - 0.001)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


def extreme_cases(class_name: str, resource: str
                  ) -> tuple[list[tuple[str, str, dict[str, Any]]], list[tuple[str, str, bytes]]]:
    """(through the API server: name, kind, body), (straight to the webhook: name, path, body)."""
    import orjson

    from cozygpu import keys
    from cozygpu.admission.envelope import MAX_BODY
    from tests.admission.harness import vmi_body

    def vmi(name: str, refs: list[dict[str, Any]], devices: dict[str, Any] | None = None,
            spec: dict[str, Any] | None = None) -> dict[str, Any]:
        body = vmi_body(name, refs, devices=devices)
        body["spec"].update(spec or {})
        return body

    one = [{"template": "gpu", "class": class_name, "count": 1}]
    terms = [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["a"]}]}] * 2000
    api = [
        ("VMI, 1 template of 1 GPU (typical)", "vmi", vmi("x-typical", one)),
        ("VMI, a template of 3,000,000 GPUs", "vmi", vmi("x-count", [{**one[0], "count": 3_000_000}])),
        ("VMI, 32 templates of 200 GPUs", "vmi",
         vmi("x-32", [{"template": f"t{i}", "class": class_name, "count": 200} for i in range(32)])),
        ("VMI, 5,000 gpus entries", "vmi",
         vmi("x-gpus", one, devices={"gpus": [{"name": f"g{i}", "deviceName": resource} for i in range(5000)]})),
        ("VMI, 10,000 refs entries", "vmi", vmi("x-refs", [{"device": f"d{i}"} for i in range(10_000)])),
        ("VMI, 2,000 node-affinity terms", "vmi", vmi("x-aff", one, spec={"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})),
        ("GPUDevice, count 2^31-1", "gpudevice",
         {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice", "metadata": {"name": "x-big"},
          "spec": {"className": class_name, "count": 2**31 - 1}}),
    ]

    def review(obj: object) -> dict[str, Any]:
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "bench", "operation": "CREATE", "namespace": "tenant-bench", "object": obj,
                            "dryRun": True}}

    device = {"metadata": {"name": "d"}, "spec": {"className": class_name, "count": 1}}
    pod = {"metadata": {"name": "p", "ownerReferences": [{"kind": "VirtualMachineInstance", "name": "vm",
                                                            "apiVersion": "kubevirt.io/v1", "controller": True}],
                        "labels": {keys.DEVICE_REFS_LABEL: "true", "kubevirt.io": "virt-launcher"}},
           "spec": {"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(5000)]}}
    wide = orjson.dumps(review({**device, "x": [[] for _ in range((MAX_BODY - 4096) // 3)]}))
    deep = orjson.dumps(review({**device, "x": "@"})).replace(b'"@"', b"[" * 2000 + b"]" * 2000)
    string = orjson.dumps(review({**device, "x": "z" * (MAX_BODY - 4096)}))
    direct = [
        ("GPUDevice review of 1 GPU (typical)", "/validate-gpudevice", orjson.dumps(review(device))),
        ("7 MiB of empty lists", "/validate-gpudevice", wide),
        ("JSON nested 2,000 deep", "/mutate-vmi", deep),
        ("a 7 MiB string", "/validate-gpudevice", string),
        ("VMI review, a template of 3,000,000", "/mutate-vmi", orjson.dumps(review(api[1][2]))),
        ("launcher pod, 5,000 tolerations", "/mutate-launcher-pod", orjson.dumps(review(pod))),
    ]
    return api, direct


async def extreme(args: argparse.Namespace, plane: object, admin: Client, namespace: str, class_name: str,
                  resource: str, url: str) -> None:
    """The worst case beside the typical one (``--extreme``): printed, never asserted."""
    import ssl

    import aiohttp

    api, direct = extreme_cases(class_name, resource)
    vmis = f"/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances"
    devices = resource_path("gpu.cozystack.io", "v1alpha1", "gpudevices", namespace=namespace)
    order = {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUDevice", "metadata": {"name": "one"},
             "spec": {"className": class_name, "count": 1}}
    context = ssl.create_default_context(cafile=str(plane.ca_file))  # type: ignore[attr-defined]
    typical_order = statistics.median(await orders(admin, namespace, class_name, args.orders))
    print(f"[--extreme: {args.nodes} plain Nodes on the fast plane; {args.repeat} of each; {load()}]")
    print(f"typical one-unit GPUDevice order (dry run, median of {args.orders}): {ms(typical_order)}")

    async def meanwhile(send: object) -> tuple[float, float, float, str]:
        """(answer time, the one-unit order's wait, loop held, answer) for ``send`` with an order beside it."""
        with LoopLag() as lag:
            task = asyncio.ensure_future(timed(send))
            await asyncio.sleep(0)
            waited, _ = await timed(admin.create(devices, order, dry_run=True))
            took, result = await task
        return took, waited, lag.worst, str(getattr(result, "message", result))[:150]

    async def report(title: str, runs: list[tuple[float, float, float, str]], typical: float) -> None:
        took = statistics.median(r[0] for r in runs)
        waited = statistics.median(r[1] for r in runs)
        held = max(r[2] for r in runs)
        print(f"  {title:40} answer {ms(took):>9} ({took / typical:5.1f}x typical), one-unit order meanwhile "
              f"{ms(waited):>9} ({waited / typical_order:5.1f}x), loop held <= {ms(held)}")
        print(f"      -> {runs[0][3]}")

    print("through the API server (dry runs):")
    typical = 0.0
    for title, kind, body in api:
        runs = [await meanwhile(admin.create(vmis if kind == "vmi" else devices, body, dry_run=True))
                for _ in range(args.repeat)]
        typical = typical or statistics.median(r[0] for r in runs)
        await report(title, runs, typical)
    print("straight to the webhook URL (what the API server would not send):")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:

        async def post(path: str, body: bytes) -> str:
            async with session.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
                answer = await r.json()
            found = answer.get("response", {}).get("status", {}).get("message") or answer.get("error") or answer
            return f"{r.status}: {found}"

        typical = 0.0
        for title, path, raw in direct:
            runs = []
            for _ in range(args.repeat):
                took, waited, held, _ = await meanwhile(post(path, raw))
                runs.append((took, waited, held, await post(path, raw)))
            typical = typical or statistics.median(r[0] for r in runs)
            await report(f"{title} ({len(raw) / 1e6:.1f} MB)", runs, typical)


async def drive(args: argparse.Namespace) -> None:
    from cozygpu.devcluster import apply, binaries, nodes
    from cozygpu.devcluster.plane import ControlPlane
    from tests.admission.harness import VMIS, admission, vmi_body, with_binder
    from tests.binder.world import World
    from tests.support.crds import install_fixture_crd

    found = binaries.find(binaries.DEFAULT_MINOR)
    if found is None or (args.fleet and not found.full):
        sys.exit("control-plane binaries missing: run `python -m cozygpu.devcluster.binaries` first")
    print(f"starting the {'full' if args.fleet else 'fast'} plane ({load()})", file=sys.stderr)
    plane = ControlPlane.start(build=False, full=args.fleet)
    try:
        async with plane.client() as admin:
            await apply.install_crds(admin)
            await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
            namespace = f"bench-{uuid.uuid4().hex[:6]}"
            await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": namespace}})
            world = await World.make(admin, namespace)
            started = time.perf_counter()
            if args.fleet:
                fleet = [nodes.SimNode(world.node_name(f"n{i}"), {world.resource: UNITS_PER_NODE})
                         for i in range(args.nodes)]
                await nodes.add_nodes(admin, fleet)
                await nodes.wait_ready(admin, [n.name for n in fleet], timeout=300)
                await bounded([world.node(f"n{i}", UNITS_PER_NODE, create_node=False) for i in range(args.nodes)])
                print(f"{args.nodes} kwok nodes Ready with GPUNode reports in {time.perf_counter() - started:.0f} s "
                      f"({load()})", file=sys.stderr)
            else:
                await bounded([world.node(f"n{i}", UNITS_PER_NODE) for i in range(args.nodes)])
            if args.extreme:
                with tempfile.TemporaryDirectory() as tmp:
                    async with admission(plane, admin, namespace, Path(tmp), bind_wait=10,
                                         timeout_seconds=15) as served:
                        await extreme(args, plane, admin, namespace, world.gpu_class, world.resource, served.url)
                return
            baseline = await orders(admin, namespace, world.gpu_class, args.orders)
            with tempfile.TemporaryDirectory() as tmp:
                async with admission(plane, admin, namespace, Path(tmp), bind_wait=10, timeout_seconds=15) as served, \
                        with_binder(admin, served.cache):
                    devices = await orders(admin, namespace, world.gpu_class, args.orders)
                    vmis = VMIS.format(namespace)
                    # The tenants' clients: not the webhook's (its pool of 64 would be taken by the starts
                    # it is answering), and enough of them that a burst is concurrent at the API server.
                    tenants = [plane.client() for _ in range(-(-max(args.burst, 1) // TENANT_POOL))]
                    refs = [{"template": "gpu", "class": world.gpu_class, "count": 1}]
                    print(f"GPUDevice orders done; {args.starts} starts one at a time", file=sys.stderr)
                    one_by_one = []
                    for i in range(args.starts):
                        took, result = await timed(tenants[0].create(vmis, vmi_body(f"s{i}", refs)))
                        if isinstance(result, errors.ApiError):
                            raise SystemExit(f"start s{i} was refused: {result.message}")
                        one_by_one.append(took)
                    shares = {name: (served.registry.get_sample_value(f"{metric}_sum", labels) or 0.0,
                                     served.registry.get_sample_value(f"{metric}_count", labels) or 1.0)
                              for name, metric, labels in (
                                  ("vmi webhook", "cozygpu_admission_duration_seconds", {"webhook": "vmi"}),
                                  ("bind wait", "cozygpu_admission_bind_wait_seconds", {"result": "Succeeded"}),
                                  ("gpudevice webhook", "cozygpu_admission_duration_seconds",
                                   {"webhook": "gpudevice"}))}
                    print(f"a burst of {args.burst} starts of {args.burst_count} GPUs ({load()})", file=sys.stderr)
                    burst_refs = [{"template": "gpu", "class": world.gpu_class, "count": args.burst_count}]
                    started = time.perf_counter()
                    burst = await asyncio.gather(*(
                        timed(tenants[i % len(tenants)].create(vmis, vmi_body(f"b{i}", burst_refs)))
                        for i in range(args.burst)))
                    wall = time.perf_counter() - started
                    burst_load = load()
                    for tenant in tenants:
                        await tenant.close()
            listed = await admin.list_objects(resource_path("gpu.cozystack.io", "v1alpha1", "gpudevices",
                                                            namespace=namespace))
            held: dict[str, int] = {}
            for device in listed["items"]:
                status = device.get("status") or {}
                if status.get("phase") == "Bound":
                    held[status["nodeName"]] = held.get(status["nodeName"], 0) + device["spec"]["count"]
            over = {node: units for node, units in held.items() if units > UNITS_PER_NODE}
            attached: dict[str, int] = {}
            for device in listed["items"]:
                vmi = ((device.get("status") or {}).get("attachment") or {}).get("vmi")
                if vmi and vmi.startswith("b"):
                    attached[vmi] = attached.get(vmi, 0) + 1
    finally:
        plane.stop()
    admitted = [took for took, result in burst if not isinstance(result, errors.ApiError)]
    refused = [result for _, result in burst if isinstance(result, errors.ApiError)]
    where = (f"{args.nodes} kwok nodes on the full plane" if args.fleet
             else f"{args.nodes} plain Nodes on the fast plane") + f", {UNITS_PER_NODE} units each"
    print(f"[{where}; {load()} at the end]")
    p99 = quantile(one_by_one, 0.99)
    print(f"VMI admission, one at a time ({args.starts} starts of 1 GPU): p50 {ms(statistics.median(one_by_one))}, "
          f"p99 {ms(p99)}: {ratio(p99, VMI_TARGET_S)} {ms(VMI_TARGET_S)}")
    print("  where a start's time goes (means, one at a time and the orders): " + ", ".join(
        f"{name} {ms(total / count)}" for name, (total, count) in shares.items()))
    worst = max(t for t, _ in burst)
    print(f"burst of {args.burst} concurrent starts of {args.burst_count} GPUs: {len(admitted)} admitted, "
          f"{len(refused)} refused, p50 {ms(statistics.median([t for t, _ in burst]))}, worst {ms(worst)}: "
          f"{ratio(worst, BIND_WAIT_S)} bind wait {BIND_WAIT_S:g} s; all answered in {wall:.2f} s ({burst_load}); "
          f"nodes over capacity: {over or 'none'}; admitted VMIs with a device attached: {len(attached)}")
    if refused:
        print(f"  first refusal: {refused[0].message}")  # type: ignore[union-attr]
    device_p99 = quantile(devices, 0.99)
    print(f"GPUDevice admission (dry run, {args.orders} orders): p50 {ms(statistics.median(devices))}, "
          f"p99 {ms(device_p99)}: {ratio(device_p99, DEVICE_TARGET_S)} {ms(DEVICE_TARGET_S)}; without the webhook: "
          f"p50 {ms(statistics.median(baseline))}, p99 {ms(quantile(baseline, 0.99))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fleet", action="store_true", help="the full plane and the 1,000-node kwok fleet")
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--burst-count", type=int, default=None,
                        help="GPUs of each burst start (default: 8, a whole node, with --fleet; else 1)")
    parser.add_argument("--nodes", type=int, default=None, help="default: 1,000 with --fleet, else 50")
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--extreme", action="store_true",
                        help="the worst case (extreme requests) beside the typical one; no starts or burst")
    parser.add_argument("--repeat", type=int, default=5, help="with --extreme: sends of each case")
    args = parser.parse_args()
    if args.nodes is None:
        args.nodes = FLEET_NODES if args.fleet else 50
    if args.burst_count is None:
        args.burst_count = UNITS_PER_NODE if args.fleet else 1
    asyncio.run(drive(args))


if __name__ == "__main__":
    main()
