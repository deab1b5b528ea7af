"""One flag reader: command line, else ``COZYGPU_<FLAG>``, else the default."""

from __future__ import annotations

import pytest

from cozygpu.base.flags import Flag, FlagError, FlagSet, env_name, parse_bool, parse_positive_duration

FLAGS = FlagSet("test", "a test command", [
    Flag("--wait", "DURATION", "10s", "how long"),
    Flag("--once", None, "false", "just once"),
    Flag("--name", "NAME", None, "who"),
])


def test_the_environment_variable_of_a_flag_is_its_name_in_capitals() -> None:
    assert env_name("--bind-wait") == "COZYGPU_BIND_WAIT"


def test_the_command_line_wins_over_the_environment_which_wins_over_the_default() -> None:
    assert FLAGS.read([], {}).raw("--wait") == "10s"
    assert FLAGS.read([], {"COZYGPU_WAIT": "1m"}).raw("--wait") == "1m"
    assert FLAGS.read(["--wait", "2s"], {"COZYGPU_WAIT": "1m"}).raw("--wait") == "2s"
    assert FLAGS.read([], {}).raw("--name") is None


def test_a_boolean_flag_alone_means_true() -> None:
    values = FLAGS.read(["--once", "--name", "n"], {})
    assert (values.raw("--once"), values.raw("--name")) == ("true", "n")


def test_a_value_may_start_with_a_dash() -> None:
    assert FLAGS.read(["--wait", "-1m"], {}).raw("--wait") == "-1m"


def test_an_unknown_flag_is_a_flag_error() -> None:
    with pytest.raises(FlagError):
        FLAGS.read(["--nope"], {})


@pytest.mark.parametrize("text", ["0s", "-1s", "soon", "1d"])
def test_a_duration_must_be_positive_and_readable(text: str) -> None:
    with pytest.raises(FlagError, match="--wait"):
        parse_positive_duration("--wait", text)


def test_a_boolean_must_be_true_or_false() -> None:
    assert (parse_bool("--once", "yes"), parse_bool("--once", "0")) == (True, False)
    with pytest.raises(FlagError, match="true or false"):
        parse_bool("--once", "maybe")
