"""Admission bench: VMI starts as a client sees them (API server → webhook → binder → answer), and GPUDevice orders.

    python bench/bench_admission.py [--starts 200] [--burst 200] [--nodes 50] [--orders 200]

Starts its own API server (the project's envtest) with the CRDs, a class and
``--nodes`` nodes of 8 units each (plain Nodes made Ready, and their GPUNode
reports), then runs the webhooks and a binder on its pass driver in this
process over one cache, registered with the API server by URL on loopback
HTTPS, as the tests do. Figures, printed, never asserted:

- VMI create latency, one start at a time (each VMI with one template device
  of one GPU): create sent → the API server's answer, p50/p99 over ``--starts``.
- A burst of ``--burst`` concurrent starts: how many were admitted, the worst
  latency, and whether any node ended with more units held than it serves
  (double booking), read from the final state.
- GPUDevice admission: dry-run creates (the validating webhook runs, nothing
  is stored), p50/p99 over ``--orders``; and the same without the webhook
  registered, so the webhook's own share shows.

Targets: VMI admission p99 <= 150 ms, GPUDevice admission p99 <= 20 ms. This
is not the issue's 1,000-node kwok fleet (plain Nodes, no scheduler): the
webhook and the binder read only GPU objects, Nodes and pods, which this
plane has as many of as it needs for the starts.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cozygpu.kube import Client, errors, resource_path  # noqa: E402

VMI_TARGET_S = 0.150
DEVICE_TARGET_S = 0.020


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


async def drive(args: argparse.Namespace) -> None:
    from cozygpu.devcluster import apply, binaries
    from cozygpu.devcluster.plane import ControlPlane
    from tests.admission.harness import VMIS, admission, vmi_body, with_binder
    from tests.binder.world import World
    from tests.support.crds import install_fixture_crd

    if binaries.find(binaries.DEFAULT_MINOR) is None:
        sys.exit("control-plane binaries missing: run `python -m cozygpu.devcluster.binaries` first")
    plane = ControlPlane.start(build=False)
    try:
        async with plane.client() as admin:
            await apply.install_crds(admin)
            await install_fixture_crd(admin, "virtualmachineinstances.kubevirt.io")
            namespace = f"bench-{uuid.uuid4().hex[:6]}"
            await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": namespace}})
            world = await World.make(admin, namespace)
            await asyncio.gather(*(world.node(f"n{i}", 8) for i in range(args.nodes)))
            baseline = await orders(admin, namespace, world.gpu_class, args.orders)
            with tempfile.TemporaryDirectory() as tmp:
                async with admission(plane, admin, namespace, Path(tmp), bind_wait=10, timeout_seconds=15) as served, \
                        with_binder(admin, served.cache):
                    devices = await orders(admin, namespace, world.gpu_class, args.orders)
                    vmis = VMIS.format(namespace)
                    refs = [{"template": "gpu", "class": world.gpu_class, "count": 1}]
                    print(f"GPUDevice orders done; {args.starts} starts one at a time", file=sys.stderr)
                    one_by_one = []
                    for i in range(args.starts):
                        took, result = await timed(admin.create(vmis, vmi_body(f"s{i}", refs)))
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
                    print(f"a burst of {args.burst}", file=sys.stderr)
                    started = time.perf_counter()
                    burst = await asyncio.gather(*(timed(admin.create(vmis, vmi_body(f"b{i}", refs)))
                                                   for i in range(args.burst)))
                    wall = time.perf_counter() - started
            listed = await admin.list_objects(resource_path("gpu.cozystack.io", "v1alpha1", "gpudevices",
                                                            namespace=namespace))
            held: dict[str, int] = {}
            for device in listed["items"]:
                status = device.get("status") or {}
                if status.get("phase") == "Bound":
                    held[status["nodeName"]] = held.get(status["nodeName"], 0) + device["spec"]["count"]
            over = {node: units for node, units in held.items() if units > 8}
    finally:
        plane.stop()
    admitted = [took for took, result in burst if not isinstance(result, errors.ApiError)]
    refused = [result for _, result in burst if isinstance(result, errors.ApiError)]
    print(f"VMI admission, one at a time ({args.starts} starts): p50 {ms(statistics.median(one_by_one))}, "
          f"p99 {ms(quantile(one_by_one, 0.99))} (target p99 <= {ms(VMI_TARGET_S)})")
    print("  where a start's time goes (means, one at a time and the orders): " + ", ".join(
        f"{name} {ms(total / count)}" for name, (total, count) in shares.items()))
    print(f"burst of {args.burst} concurrent starts: {len(admitted)} admitted, {len(refused)} refused, "
          f"worst {ms(max(t for t, _ in burst))}, all answered in {wall:.2f} s; "
          f"nodes over capacity: {over or 'none'}")
    if refused:
        print(f"  first refusal: {refused[0].message}")  # type: ignore[union-attr]
    print(f"GPUDevice admission (dry run, {args.orders} orders): p50 {ms(statistics.median(devices))}, "
          f"p99 {ms(quantile(devices, 0.99))} (target p99 <= {ms(DEVICE_TARGET_S)}); without the webhook: "
          f"p50 {ms(statistics.median(baseline))}, p99 {ms(quantile(baseline, 0.99))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--orders", type=int, default=200)
    asyncio.run(drive(parser.parse_args()))


if __name__ == "__main__":
    main()
