"""Flags of a cozygpu command, read from the command line and ``COZYGPU_<FLAG>``.

Contract:
- A ``FlagSet`` is declared once as ``Flag`` rows; ``read(argv, env)`` gives
  each flag's raw text: the command line wins over the environment variable
  (``--bind-wait`` reads ``COZYGPU_BIND_WAIT``), which wins over the default.
- A flag with no metavar is a boolean: ``--once`` alone means true, and
  ``--once=false`` or ``COZYGPU_ONCE=false`` are accepted too.
- ``--flag VALUE`` may take a value that starts with a dash (``-1m``).
- Every bad value raises ``FlagError`` naming the flag, the value and the rule
  it broke; commands print it and exit 2. The value parsers here (booleans,
  positive Go-style durations, choices) raise it too.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Final, NoReturn

import attrs

from cozygpu.base.durations import parse_duration

ENV_PREFIX: Final = "COZYGPU_"
_TRUE: Final = frozenset({"1", "t", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "f", "false", "no", "off"})


class FlagError(ValueError):
    """A flag value that cannot be used; the message names flag, value and rule."""

    def __init__(self, flag: str, value: object, rule: str) -> None:
        self.flag = flag
        self.value = value
        self.rule = rule
        if not flag:
            super().__init__(rule)
        elif value is None:
            super().__init__(f"{flag}: {rule}")
        else:
            super().__init__(f"{flag}={value!s}: {rule}")


@attrs.frozen
class Flag:
    """One flag: ``metavar`` None makes it a boolean; ``default`` None means unset."""

    name: str
    metavar: str | None
    default: str | None
    help: str


def env_name(flag: str) -> str:
    """``--bind-wait`` -> ``COZYGPU_BIND_WAIT``."""
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise FlagError("", None, message)


@attrs.frozen
class Values:
    """The raw text of every flag of one command line, after environment and defaults."""

    _raw: Mapping[str, str | None]

    def raw(self, flag: str) -> str | None:
        return self._raw[flag]

    def required(self, flag: str) -> str:
        """The text of a flag that has a default."""
        value = self._raw[flag]
        assert value is not None, flag
        return value


class FlagSet:
    """A command's flags, in the order of ``--help``."""

    def __init__(self, prog: str, description: str, flags: Sequence[Flag]) -> None:
        self.prog = prog
        self.description = description
        self.flags: dict[str, Flag] = {flag.name: flag for flag in flags}

    def parser(self) -> argparse.ArgumentParser:
        parser = _Parser(prog=self.prog, description=self.description)
        for flag in self.flags.values():
            shown = f" (default: {flag.default})" if flag.default not in (None, "") else ""
            text = f"{flag.help}{shown} [env {env_name(flag.name)}]"
            if flag.metavar is None:
                parser.add_argument(flag.name, nargs="?", const="true", default=None, metavar="BOOL", help=text)
            else:
                parser.add_argument(flag.name, default=None, metavar=flag.metavar, help=text)
        return parser

    def _join_values(self, argv: Sequence[str]) -> list[str]:
        """``--flag VALUE`` as ``--flag=VALUE``, so a value may start with a dash."""
        out: list[str] = []
        args = list(argv)
        i = 0
        while i < len(args):
            arg = args[i]
            flag = self.flags.get(arg)
            if flag is not None and flag.metavar is not None and i + 1 < len(args):
                out.append(f"{arg}={args[i + 1]}")
                i += 2
                continue
            out.append(arg)
            i += 1
        return out

    def read(self, argv: Sequence[str], env: Mapping[str, str]) -> Values:
        given = vars(self.parser().parse_args(self._join_values(argv)))
        raw: dict[str, str | None] = {}
        for name, flag in self.flags.items():
            value: str | None = given[name.lstrip("-").replace("-", "_")]
            if value is None:
                value = env.get(env_name(name))
            if value is None:
                value = flag.default
            raw[name] = value
        return Values(raw)


# -- values ---------------------------------------------------------------------------------


def parse_bool(flag: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise FlagError(flag, raw, "must be true or false")


def parse_positive_duration(flag: str, raw: str) -> float:
    try:
        seconds = parse_duration(raw)
    except ValueError:
        raise FlagError(flag, raw, "not a duration (write it like 10s, 2m or 1m30s)") from None
    if seconds <= 0:
        raise FlagError(flag, raw, "must be positive")
    return seconds


def choice(flag: str, raw: str, allowed: Sequence[str]) -> str:
    value = raw.strip().lower()
    if value not in allowed:
        raise FlagError(flag, raw, f"must be one of {', '.join(allowed)}")
    return value
