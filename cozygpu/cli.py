"""The ``cozygpu`` command: one entry point, one subcommand per part.

Each subcommand lives with the part it runs and is imported only when chosen,
so ``cozygpu cluster`` does not pay for the controller's imports and a part
can be built without touching this file's neighbours.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

#: subcommand -> (module with ``main(argv) -> int``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("cozygpu.devcluster.command", "a local control plane (etcd + kube-apiserver) on loopback"),
    "controller": ("cozygpu.runtime.command", "the controller: caches, webhooks, leader-only binder"),
    "agent": ("cozygpu.agent.command", "the node agent: reports this node's GPUs into its GPUNode"),
    "catalog": ("cozygpu.commands.catalog", "what a tenant namespace can order now, and why not"),
    "status": ("cozygpu.commands.status", "classes, nodes, waiting devices, the leader and pass health"),
    "why": ("cozygpu.commands.why", "the last decision about a GPUDevice or VMI, and what would change it"),
    "usage": ("cozygpu.commands.usage", "GPU units held, running and idle per tenant, and GPU-hours held and idle"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: cozygpu COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"cozygpu: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    try:
        result: int = module.main(rest)
    except BrokenPipeError:
        # The reader went away (`cozygpu cluster start | head -1`): what was done is done,
        # and Python must not fail again flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return result


if __name__ == "__main__":
    raise SystemExit(main())
