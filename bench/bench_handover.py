"""Hand-over bench: how long bind requests would wait when the leader is rolled (SIGTERM).

    python bench/bench_handover.py [--runs 5] [--short]

Starts its own API server (the project's envtest) with the CRDs and, per run, two
``cozygpu controller`` replicas in a fresh namespace with the default
election durations (lease 15 s, renew deadline 10 s, retry 2 s; ``--short``:
4 s / 3 s / 0.5 s as in the tests). Once one leads and the other has
campaigned for a second, the leader gets SIGTERM; the figure is the time from
the signal to the standby's ``leader-work-started`` line, both on this host's
monotonic clock. Target <= 1 s. Printed, never asserted: this is a bench.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cozygpu.kube import Client, resource_path  # noqa: E402
from tests.runtime.processes import ControllerProcess, ControllerProcesses  # noqa: E402

TARGET_S = 1.0
DEFAULT_ELECTION = ("--lease-duration", "15s", "--renew-deadline", "10s", "--retry-period", "2s")
STARTED = "leader-work-started"


async def first_leader(a: ControllerProcess, b: ControllerProcess) -> ControllerProcess:
    waits = {asyncio.ensure_future(p.wait_event(STARTED, timeout=120)): p for p in (a, b)}
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        task = done.pop()
        task.result()
        return waits[task]
    finally:
        for task in waits:
            task.cancel()


async def one_run(admin: Client, kubeconfig: Path, election: tuple[str, ...]) -> float:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    await admin.create(resource_path("", "v1", "namespaces"), {"metadata": {"name": namespace}})
    processes = ControllerProcesses(kubeconfig, namespace)
    try:
        a = await processes.start("a", *election)
        b = await processes.start("b", *election)
        leader = await first_leader(a, b)
        standby = b if leader is a else a
        await asyncio.sleep(1)
        sent = time.monotonic()
        leader.terminate()
        took_over = await standby.wait_event(STARTED, timeout=120)
        await leader.exit_code(timeout=30)
        standby.terminate()
        await standby.exit_code(timeout=30)
        return float(took_over["monotonic"]) - sent
    finally:
        await processes.close()


async def drive(args: argparse.Namespace) -> None:
    from cozygpu.devcluster import apply, binaries
    from cozygpu.devcluster.plane import ControlPlane

    if binaries.find(binaries.DEFAULT_MINOR) is None:
        sys.exit("control-plane binaries missing: run `python -m cozygpu.devcluster.binaries` first")
    election = () if args.short else DEFAULT_ELECTION  # the replicas' flags default to the short durations
    plane = ControlPlane.start(build=False)
    try:
        async with plane.client() as admin:
            await apply.install_crds(admin)
            figures = []
            for run in range(args.runs):
                figures.append(await one_run(admin, plane.kubeconfig, election))
                print(f"run {run + 1}: SIGTERM handover {figures[-1]:.3f} s")
    finally:
        plane.stop()
    durations = "lease 4 s, renew 3 s, retry 0.5 s" if args.short else "lease 15 s, renew 10 s, retry 2 s"
    print(f"SIGTERM handover ({durations}): median {statistics.median(figures):.3f} s, "
          f"worst {max(figures):.3f} s over {len(figures)} runs (target <= {TARGET_S:g} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--short", action="store_true", help="the tests' short election durations")
    asyncio.run(drive(parser.parse_args()))


if __name__ == "__main__":
    main()
