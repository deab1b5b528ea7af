"""``kubectl gpu``: the commands for people as a kubectl plugin, spoken with kubectl's flags.

kubectl runs ``kubectl-gpu`` from the PATH for ``kubectl gpu ...`` and hands
it every word after ``gpu`` as typed, kubectl's flags before or after the
command. This module is the one place kubectl's conventions meet the
commands': it turns the words into the command line ``cozygpu COMMAND``
takes and runs that command, so the answer is the same one; only ``-o yaml``
is made here, from the command's JSON.

Contract:
- kubectl's flags are read anywhere before ``--``: ``--kubeconfig``,
  ``--context``, ``-n/--namespace``, ``-A/--all-namespaces``,
  ``-o/--output json|yaml|wide``, ``-h/--help``; a value as ``-n x``,
  ``-n=x``, ``-nx`` or ``--namespace=x``; the last one given wins. Every
  other word is the command's own (``--count``, ``--answer-within``, why's
  ``KIND/NAME``) and passes unchanged, for the command's parser to judge.
- ``-n`` names the namespace of a command that reads one (catalog, why),
  which needs it; ``-A`` fits a command that reads every namespace (status).
  A command that reads either (usage) reads one with ``-n`` and every one
  with ``-A`` or without either; both at once are refused.
  A namespace missing, a flag with no meaning for the command (-A for why,
  -n for status) or a malformed flag is one line on stderr and exit code 2,
  as argparse's errors are.
- Without ``-o``, and with ``-o wide``, the command's own view (no command
  has wider columns); ``-o json`` is the command's JSON; ``-o yaml`` the
  same data as YAML (PyYAML, keys in the command's order).
- The kubeconfig is found as the commands find it (``--kubeconfig``, else
  ``$KUBECONFIG``, else ``~/.kube/config``), as kubectl does.
- A command becomes a verb here with one entry in :data:`VERBS`.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import io
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, Final

import attrs
import yaml

PROG: Final = "kubectl gpu"


class Scope(enum.Enum):
    #: The command reads one namespace, named with -n; -A has no meaning.
    NAMESPACE = "namespace"
    #: The command reads every namespace; -A is what it does anyway, -n has no meaning.
    CLUSTER = "cluster"
    #: The command reads one namespace with -n, else every namespace (-A says so).
    EITHER = "either"


@attrs.frozen(kw_only=True)
class Verb:
    #: The module whose ``main(argv) -> int`` is ``cozygpu <verb>``.
    module: str
    help: str
    scope: Scope
    #: What the command reads, for the line refusing a flag of the other scope.
    reads: str
    #: The command's name for its own view, shown without -o: ``table`` or ``text``.
    view: str


VERBS: Final[dict[str, Verb]] = {
    "catalog": Verb(module="cozygpu.commands.catalog", help="what a tenant namespace can order now, and why not",
                    scope=Scope.NAMESPACE, reads="answers for one tenant namespace", view="table"),
    "status": Verb(module="cozygpu.commands.status",
                   help="classes, nodes, waiting devices, the leader and pass health",
                   scope=Scope.CLUSTER, reads="reads every namespace", view="table"),
    "why": Verb(module="cozygpu.commands.why",
                help="the last decision about a GPUDevice or VMI, and what would change it",
                scope=Scope.NAMESPACE, reads="explains one object of one namespace", view="text"),
    "usage": Verb(module="cozygpu.commands.usage",
                  help="GPU units held, running and idle per tenant, and GPU-hours held and idle",
                  scope=Scope.EITHER, reads="reads one namespace with -n, every namespace with -A", view="table"),
}

OUTPUTS: Final = ("json", "yaml", "wide")
#: kubectl's flags that take a value, by every spelling, and the field each sets.
_VALUED: Final = {"--kubeconfig": "kubeconfig", "--context": "context", "-n": "namespace",
                  "--namespace": "namespace", "-o": "output", "--output": "output"}
_ALL_NAMESPACES: Final = frozenset({"-A", "--all-namespaces"})
_HELP: Final = frozenset({"-h", "--help"})


class FlagError(ValueError):
    """Words kubectl gpu cannot run: one line for a person, exit code 2."""

    def __init__(self, message: str, *, verb: str | None = None) -> None:
        super().__init__(message)
        self.verb = verb

    def line(self) -> str:
        return f"{PROG}{f' {self.verb}' if self.verb else ''}: {self}"


@attrs.frozen(kw_only=True)
class Invocation:
    """``cozygpu <verb> <argv>``, and whether its JSON is to be shown as YAML."""

    verb: str
    argv: tuple[str, ...]
    yaml: bool = False


@attrs.frozen(kw_only=True)
class Help:
    """The plugin's help, or a verb's (None: the plugin's)."""

    verb: str | None = None


@attrs.define
class _Flags:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    output: str | None = None
    all_namespaces: bool = False
    help: bool = False


def _value_of(words: Sequence[str], at: int, verb: str | None) -> tuple[str, str, int]:
    """(flag, value, words used) of the kubectl flag taking a value at ``words[at]``."""
    word = words[at]
    if word.startswith("--"):
        flag, eq, value = word.partition("=")
        attached = bool(eq)
    else:
        flag, value, attached = word[:2], word[2:].removeprefix("="), len(word) > 2
    used = 1
    if not attached:
        if at + 1 >= len(words):
            raise FlagError(f"flag needs an argument: {flag}", verb=verb)
        value, used = words[at + 1], 2
    if not value:
        raise FlagError(f"flag {flag} needs a non-empty value", verb=verb)
    return flag, value, used


def _is_valued(word: str) -> bool:
    return (word.partition("=")[0] if word.startswith("--") else word[:2]) in _VALUED


def _all_namespaces(word: str, verb: str | None) -> bool:
    flag, eq, value = word.partition("=")
    if not eq:
        return True
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise FlagError(f"invalid argument {value!r} for {flag}: true or false", verb=verb)


def _scan(words: Sequence[str]) -> tuple[str | None, _Flags, list[str]]:
    """The verb, kubectl's flags, and the command's own words in their order."""
    flags = _Flags()
    verb: str | None = None
    rest: list[str] = []
    at = 0
    while at < len(words):
        word = words[at]
        if word == "--":
            if verb is None:
                raise FlagError("`--` before the command: name the command first")
            rest += words[at:]
            break
        if _is_valued(word):
            flag, value, used = _value_of(words, at, verb)
            setattr(flags, _VALUED[flag], value)
            at += used
            continue
        if word.partition("=")[0] in _ALL_NAMESPACES:
            flags.all_namespaces = _all_namespaces(word, verb)
        elif word in _HELP:
            flags.help = True
        elif verb is None and word.startswith("-"):
            raise FlagError(f"unknown flag {word} before the command: only kubectl's flags may stand there, "
                            "a command's own flags follow it")
        elif verb is None:
            verb = word
        else:
            rest.append(word)
        at += 1
    return verb, flags, rest


def translate(words: Sequence[str]) -> Invocation | Help:
    """What ``kubectl gpu <words>`` runs; raises :class:`FlagError` for words it cannot run."""
    verb, flags, rest = _scan(words)
    if verb == "help" or (verb is None and flags.help):
        return Help()
    if verb is None:
        raise FlagError("name a command: " + ", ".join(VERBS) + f" (`{PROG} --help`)")
    spec = VERBS.get(verb)
    if spec is None:
        raise FlagError(f"unknown command {verb!r} (the commands: {', '.join(VERBS)})")
    if flags.help:
        return Help(verb=verb)
    if flags.output is not None and flags.output not in OUTPUTS:
        raise FlagError(f"-o {flags.output}: the output formats are {', '.join(OUTPUTS)} "
                        f"(without -o: the {spec.view})", verb=verb)
    argv: list[str] = []
    if spec.scope is Scope.NAMESPACE:
        if flags.all_namespaces:
            raise FlagError(f"-A/--all-namespaces has no meaning here: {verb} {spec.reads}; "
                            "name the namespace with -n", verb=verb)
        if flags.namespace is None:
            raise FlagError(f"name the namespace with -n: {verb} {spec.reads}", verb=verb)
        argv += ["--namespace", flags.namespace]
    elif spec.scope is Scope.EITHER:
        if flags.all_namespaces and flags.namespace is not None:
            raise FlagError(f"-n and -A together: {verb} {spec.reads}; drop one", verb=verb)
        if flags.namespace is not None:
            argv += ["--namespace", flags.namespace]
    elif flags.namespace is not None:
        raise FlagError(f"-n/--namespace has no meaning here: {verb} {spec.reads}; drop -n", verb=verb)
    if flags.output in ("json", "yaml"):
        argv += ["--output", "json"]
    if flags.kubeconfig is not None:
        argv += ["--kubeconfig", flags.kubeconfig]
    if flags.context is not None:
        argv += ["--context", flags.context]
    return Invocation(verb=verb, argv=(*argv, *rest), yaml=flags.output == "yaml")


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, but a string holding a character YAML reads as a line break is double-quoted.

    Left to itself the dumper single-quotes NEL, LS and PS unescaped and they
    read back as a space (the round-trip property test pins this).
    """


_BREAKS: Final = frozenset("\x85\u2028\u2029")


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = '"' if any(ch in _BREAKS for ch in value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def as_yaml(data: Any) -> str:
    """JSON-shaped ``data`` as YAML that reads back equal: keys in their order, ambiguous strings quoted."""
    text: str = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False,
                          width=2**31 - 1)
    return text


def usage() -> str:
    width = max(len(name) for name in VERBS)
    one = ", ".join(n for n, v in VERBS.items() if v.scope is not Scope.CLUSTER)
    every = ", ".join(n for n, v in VERBS.items() if v.scope is Scope.CLUSTER)
    either = ", ".join(n for n, v in VERBS.items() if v.scope is Scope.EITHER)
    return "\n".join([
        f"usage: {PROG} COMMAND [flags]",
        "",
        "commands:",
        *(f"  {name:<{width}}  {verb.help}" for name, verb in VERBS.items()),
        "",
        "kubectl's flags, before or after the command:",
        f"  -n, --namespace NAME      the namespace ({one})",
        f"  -A, --all-namespaces      every namespace ({every}, which reads them all anyway; {either}, "
        "also without -n)",
        "  -o, --output FORMAT       json, yaml or wide (default: the command's own table or text)",
        "      --kubeconfig PATH     kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
        "      --context NAME        the kubeconfig context to use (default: its current context)",
        f"  -h, --help                this help; `{PROG} COMMAND --help` adds the command's own flags",
    ])


def _verb_help(verb: str) -> int:
    """The plugin's flags, then the command's own help (its -n, -o and kubeconfig flags are the same ones)."""
    print(f"{usage()}\n\nthe flags of `cozygpu {verb}`, which `{PROG} {verb}` runs:\n")
    sys.stdout.flush()
    try:
        code: int = importlib.import_module(VERBS[verb].module).main(["--help"])
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0
    return code


def run(invocation: Invocation) -> int:
    module = importlib.import_module(VERBS[invocation.verb].module)
    if not invocation.yaml:
        code: int = module.main(list(invocation.argv))
        return code
    answer = io.StringIO()
    with contextlib.redirect_stdout(answer):
        code = module.main(list(invocation.argv))
    if code != 0:
        sys.stdout.write(answer.getvalue())
        return code
    sys.stdout.write(as_yaml(json.loads(answer.getvalue())))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        request = translate(words)
    except FlagError as err:
        print(err.line(), file=sys.stderr)
        return 2
    try:
        if isinstance(request, Help):
            if request.verb is None:
                print(usage())
                return 0
            return _verb_help(request.verb)
        return run(request)
    except BrokenPipeError:
        # The reader went away (`kubectl gpu status | head -1`), as for `cozygpu`: what was shown is shown,
        # and Python must not fail again flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
