"""What a scrape of the per-node families costs, and what it costs the event loop beside it.

    python bench/bench_scrape.py [--sizes 1000,5000,10000] [--reps 7] [--seconds 10]

In-process. At N nodes (8 units each, one GPUClass, a hold Bound on every
other node) the binder's two per-node families (``cozygpu_binder_node_units``:
three series per node; ``cozygpu_binder_node_report_timestamp_seconds``: one)
are rendered to the text format two ways, each timed (median of ``--reps``):

- **library**: the same families as a collector of a registry, rendered by
  ``prometheus_client.generate_latest`` (how they were served before);
- **ours, first scrape**: ``PerNodeUnits.exposition()`` with nothing kept;
- **ours, next scrape**: after an eighth of the nodes' reports moved (what
  a 15 s scrape sees of agents reporting every 2 min), each node's lines
  kept from the scrape before unless its figures moved.

Then the event loop beside it (uvloop, as the controller runs): a ticker
due every 10 ms and a stream of small socket round trips on the loop, while
a thread renders a scrape once a second (as ``/metrics`` does, off the
loop): the ticker's lateness p50 / p99 / max over ``--seconds`` for no
scrapes, the library's, and ours. A thread that renders holds the
interpreter lock in 5 ms slices, so the loop is late while it runs, however
the work is split. Nothing is asserted; figures are for people.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attrs  # noqa: E402
import uvloop  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from cozygpu.binder.metrics import PerNodeUnits  # noqa: E402
from cozygpu.model.derive import ModelTables  # noqa: E402
from cozygpu.model.snapshot import Phase, Snapshot  # noqa: E402
from tests.model.factories import NOW, device, gpu_class, gpu_nodes  # noqa: E402
from tests.support.library_metrics import LibraryNodeFamilies  # noqa: E402


def fleet(n: int) -> tuple[ModelTables, Snapshot, list[str]]:
    names = [f"gpu-node-{i:05d}" for i in range(n)]
    nodes, inventories = gpu_nodes(*((name, 8) for name in names))
    devices = [device(f"d{i}", namespace=f"tenant-{i % 20}", phase=Phase.BOUND, node=names[i])
               for i in range(0, n, 2)]
    tables = ModelTables()
    snapshot = tables.rebuild(now=NOW, classes=[gpu_class()], devices=devices, nodes=nodes,
                              inventories=inventories, pods=(), vmis=(), namespaces=())
    return tables, snapshot, names


def timed(render: Callable[[], bytes], reps: int) -> tuple[float, int]:
    """Median ms of ``render()`` over ``reps`` calls, and the bytes it made."""
    times, size = [], 0
    for _ in range(reps):
        started = time.perf_counter()
        size = len(render())
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), size


def moved_reports(tables: ModelTables, snapshot: Snapshot, names: list[str], round_: int) -> Snapshot:
    """The snapshot after an eighth of the nodes' reports moved (a different eighth each round)."""
    at = NOW + dt.timedelta(seconds=15 * (round_ + 1))
    moved = {name: attrs.evolve(snapshot.inventories[name], last_report=at)
             for name in names[round_ % 8::8]}
    return tables.update(now=NOW, devices={}, inventories=moved)


async def lag_beside(render: Callable[[], bytes] | None, seconds: float) -> list[float]:
    """A ticker's lateness (ms) on this loop while a thread runs ``render`` once a second, beside small
    socket round trips."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    late: list[float] = []

    async def traffic() -> None:
        while True:
            writer.write(b"x" * 200)
            await writer.drain()
            await reader.readexactly(200)
            await asyncio.sleep(0.002)

    async def ticker() -> None:
        while True:
            due = time.perf_counter() + 0.01
            await asyncio.sleep(0.01)
            late.append(max(time.perf_counter() - due, 0.0) * 1000)  # uvloop's timers may fire <1 ms early

    async def scrapes() -> None:
        while render is not None:
            await asyncio.sleep(1.0)
            await asyncio.to_thread(render)

    tasks = [asyncio.create_task(each()) for each in (traffic, ticker, scrapes)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    writer.close()
    server.close()
    await server.wait_closed()
    return late


def quantiles(values: list[float]) -> str:
    ordered = sorted(values)

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]

    return f"p50 {at(0.5):6.2f}  p99 {at(0.99):6.2f}  max {ordered[-1]:6.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,5000,10000")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=10.0, help="the loop's lateness is read over this long")
    args = parser.parse_args()
    print(f"bench_scrape: sizes {args.sizes}, {args.reps} reps; per-node families: 4 series per node")
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        tables, snapshot, names = fleet(n)
        library = LibraryNodeFamilies(snapshot)
        registry = CollectorRegistry()
        registry.register(library)
        ours = PerNodeUnits()
        ours.snapshot = snapshot
        lib_ms, lib_bytes = timed(functools.partial(generate_latest, registry), args.reps)
        started = time.perf_counter()
        our_bytes = len(ours.exposition())
        first_ms = (time.perf_counter() - started) * 1000
        next_times = []
        for round_ in range(args.reps):
            ours.snapshot = snapshot = moved_reports(tables, snapshot, names, round_)
            started = time.perf_counter()
            ours.exposition()
            next_times.append((time.perf_counter() - started) * 1000)
        next_ms = statistics.median(next_times)
        print(f"N={n}: library {lib_ms:.1f} ms ({lib_bytes / 1e6:.2f} MB); ours, first scrape {first_ms:.1f} ms"
              f" ({our_bytes / 1e6:.2f} MB); ours, next scrape {next_ms:.1f} ms; library ÷ ours (next) "
              f"{lib_ms / next_ms:.0f}×", flush=True)
        library.snapshot = ours.snapshot
        for what, render in (("no scrapes", None), ("library", functools.partial(generate_latest, registry)),
                             ("ours", ours.exposition)):
            late = uvloop.run(lag_beside(render, args.seconds))
            print(f"    the loop's ticker beside a scrape a second, {what:>10}: {quantiles(late)}", flush=True)
        rows.append((n, lib_ms, first_ms, next_ms))
    if len(rows) > 1:
        (n0, lib0, _, ours0), (n1, lib1, _, ours1) = rows[0], rows[-1]
        print(f"growth {n0} -> {n1} nodes: library {lib1 / lib0:.1f}×, ours (next scrape) {ours1 / ours0:.1f}×")


if __name__ == "__main__":
    main()
