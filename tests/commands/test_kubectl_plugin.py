"""``kubectl gpu``'s words become the ``cozygpu`` command line that answers them; no cluster is needed.

The translation is checked as data (``translate``), and through ``main`` as
far as the commands' own parsers and their one line about a kubeconfig that
does not exist, which shows the words reached the command as it takes them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cozygpu import cli
from cozygpu.commands import kubectl_plugin
from cozygpu.commands.kubectl_plugin import Help, Invocation, as_yaml, translate

CATALOG_JSON = Invocation(verb="catalog", argv=("--namespace", "acme", "--output", "json"))


@pytest.mark.parametrize("words", [
    ["-n", "acme", "catalog", "-o", "json"],
    ["catalog", "-n", "acme", "-o", "json"],
    ["-o", "json", "-n", "acme", "catalog"],
    ["catalog", "-o", "json", "-n", "acme"],
])
def test_kubectls_flags_mean_the_same_before_or_after_the_command(words: list[str]) -> None:
    assert translate(words) == CATALOG_JSON


@pytest.mark.parametrize("words", [
    ["catalog", "-n", "acme", "-o", "json"],
    ["catalog", "-n=acme", "-o=json"],
    ["catalog", "-nacme", "-ojson"],
    ["catalog", "--namespace", "acme", "--output", "json"],
    ["catalog", "--namespace=acme", "--output=json"],
])
def test_every_spelling_kubectl_accepts_for_a_flags_value_is_read(words: list[str]) -> None:
    assert translate(words) == CATALOG_JSON


def test_the_last_of_a_repeated_flag_wins_as_in_kubectl() -> None:
    assert translate(["-n", "beta", "catalog", "-o", "yaml", "-n", "acme", "-o", "json"]) == CATALOG_JSON


def test_the_kubeconfig_and_context_flags_pass_to_the_command() -> None:
    assert translate(["--kubeconfig", "/k", "status", "--context=prod"]) == Invocation(
        verb="status", argv=("--kubeconfig", "/k", "--context", "prod"))


def test_the_commands_own_words_pass_unchanged_and_in_order() -> None:
    assert translate(["why", "gpudevice/train", "-n", "acme", "--gpu-resource-names", "a,b"]) == Invocation(
        verb="why", argv=("--namespace", "acme", "gpudevice/train", "--gpu-resource-names", "a,b"))
    assert translate(["catalog", "--count", "2", "-n", "acme"]) == Invocation(
        verb="catalog", argv=("--namespace", "acme", "--count", "2"))
    assert translate(["status", "--answer-within", "5"]) == Invocation(verb="status",
                                                                        argv=("--answer-within", "5"))


def test_words_after_a_double_dash_are_the_commands_even_when_they_look_like_kubectls() -> None:
    assert translate(["why", "-n", "acme", "--", "-n"]) == Invocation(
        verb="why", argv=("--namespace", "acme", "--", "-n"))


@pytest.mark.parametrize(("output", "argv", "as_yaml_too"), [
    (None, (), False),
    ("wide", (), False),
    ("json", ("--output", "json"), False),
    ("yaml", ("--output", "json"), True),
])
def test_json_and_yaml_ask_the_command_for_json_and_wide_or_nothing_for_its_own_view(
        output: str | None, argv: tuple[str, ...], as_yaml_too: bool) -> None:
    words = ["status", *(["-o", output] if output else [])]
    assert translate(words) == Invocation(verb="status", argv=argv, yaml=as_yaml_too)


def test_all_namespaces_fits_status_which_reads_every_namespace_anyway() -> None:
    assert translate(["-A", "status"]) == translate(["status", "--all-namespaces"]) == Invocation(
        verb="status", argv=())


@pytest.mark.parametrize(("words", "says"), [
    (["catalog", "-n", "acme", "-A"],
     "kubectl gpu catalog: -A/--all-namespaces has no meaning here: catalog answers for one tenant namespace; "
     "name the namespace with -n"),
    (["-A", "why", "gpudevice/train", "-n", "acme"],
     "kubectl gpu why: -A/--all-namespaces has no meaning here: why explains one object of one namespace; "
     "name the namespace with -n"),
    (["-n", "acme", "status"],
     "kubectl gpu status: -n/--namespace has no meaning here: status reads every namespace; drop -n"),
    (["catalog"], "kubectl gpu catalog: name the namespace with -n: catalog answers for one tenant namespace"),
    (["why", "gpudevice/train"],
     "kubectl gpu why: name the namespace with -n: why explains one object of one namespace"),
])
def test_a_flag_the_command_has_no_meaning_for_or_lacks_is_one_line_and_exit_code_2(
        capsys: pytest.CaptureFixture[str], words: list[str], says: str) -> None:
    assert kubectl_plugin.main(words) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", says + "\n")


@pytest.mark.parametrize(("words", "says"), [
    (["catalog", "-n"], "kubectl gpu catalog: flag needs an argument: -n"),
    (["status", "--kubeconfig"], "kubectl gpu status: flag needs an argument: --kubeconfig"),
    (["catalog", "--namespace="], "kubectl gpu catalog: flag --namespace needs a non-empty value"),
    (["status", "-o", "table"],
     "kubectl gpu status: -o table: the output formats are json, yaml, wide (without -o: the table)"),
    (["why", "vmi/x", "-n", "a", "-o", "name"],
     "kubectl gpu why: -o name: the output formats are json, yaml, wide (without -o: the text)"),
    (["status", "--all-namespaces=maybe"],
     "kubectl gpu status: invalid argument 'maybe' for --all-namespaces: true or false"),
    (["--count", "2", "catalog"],
     "kubectl gpu: unknown flag --count before the command: only kubectl's flags may stand there, "
     "a command's own flags follow it"),
    (["stauts"], "kubectl gpu: unknown command 'stauts' (the commands: catalog, status, why, usage)"),
    ([], "kubectl gpu: name a command: catalog, status, why, usage (`kubectl gpu --help`)"),
    (["-n", "acme"], "kubectl gpu: name a command: catalog, status, why, usage (`kubectl gpu --help`)"),
])
def test_words_kubectl_gpu_cannot_run_are_one_line_and_exit_code_2(
        capsys: pytest.CaptureFixture[str], words: list[str], says: str) -> None:
    assert kubectl_plugin.main(words) == 2
    assert capsys.readouterr() == ("", says + "\n")


def test_all_namespaces_false_is_read_as_kubectl_reads_a_boolean_flag() -> None:
    assert translate(["catalog", "-n", "acme", "--all-namespaces=false"]) == Invocation(
        verb="catalog", argv=("--namespace", "acme"))


@pytest.mark.parametrize("words", [["-h"], ["--help"], ["help"], ["-n", "x", "--help"]])
def test_help_names_every_command_and_kubectls_flags(capsys: pytest.CaptureFixture[str], words: list[str]) -> None:
    assert translate(words) == Help()
    assert kubectl_plugin.main(words) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kubectl gpu COMMAND [flags]\n")
    for name in ("catalog", "status", "why"):
        assert f"\n  {name} " in out
    for flag in ("-n, --namespace", "-A, --all-namespaces", "-o, --output", "--kubeconfig", "--context"):
        assert flag in out


def test_a_commands_help_adds_the_flags_of_its_cozygpu_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert translate(["catalog", "-A", "-h"]) == Help(verb="catalog"), "help wins over a flag it would refuse"
    assert kubectl_plugin.main(["catalog", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kubectl gpu COMMAND [flags]\n")
    assert "the flags of `cozygpu catalog`, which `kubectl gpu catalog` runs:" in out
    assert "--count COUNT" in out


@pytest.mark.parametrize(("words", "command"), [
    (["-n", "acme", "catalog", "-o", "yaml"], "catalog"),
    (["status", "-A", "-o", "wide"], "status"),
    (["why", "vmi/vm", "-n", "acme", "-o", "json"], "why"),
])
def test_the_translated_words_reach_the_command_which_reads_the_kubeconfig_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str], command: str) -> None:
    missing = tmp_path / "kubeconfig"
    assert kubectl_plugin.main([*words, "--kubeconfig", str(missing)]) == 1
    out, err = capsys.readouterr()
    assert out == "", "a failed command shows no YAML, JSON or table"
    assert err == f"cozygpu {command}: kubeconfig {missing}: no such file\n"


def test_the_kubeconfig_comes_from_the_environment_as_kubectl_reads_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/a:{tmp_path}/b")
    assert kubectl_plugin.main(["status"]) == 1
    assert capsys.readouterr().err == (f"cozygpu status: kubeconfig {tmp_path}/a, {tmp_path}/b (from $KUBECONFIG): "
                                       "none of these files exists\n")


def test_the_commands_own_parser_judges_the_commands_own_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        kubectl_plugin.main(["status", "--answer-within", "soon"])
    assert done.value.code == 2
    assert "--answer-within: invalid float value: 'soon'" in capsys.readouterr().err


def test_every_verb_is_the_cozygpu_command_of_its_name() -> None:
    for name, verb in kubectl_plugin.VERBS.items():
        assert cli.COMMANDS[name] == (verb.module, verb.help)


#: JSON text holds no lone surrogate that YAML could carry.
TEXT = st.text(st.characters(codec="utf-8"))
JSON_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63)
                | st.floats(allow_nan=False, allow_infinity=False) | TEXT)
JSON_DATA = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    TEXT, inner, max_size=4), max_leaves=20)


@given(JSON_DATA)
def test_yaml_reads_back_as_the_json_it_was_made_from(data: Any) -> None:
    again = yaml.safe_load(as_yaml(json.loads(json.dumps(data))))
    assert json.dumps(again, sort_keys=True) == json.dumps(data, sort_keys=True)


def test_yaml_quotes_strings_that_would_read_as_something_else_and_keeps_the_commands_key_order() -> None:
    data: dict[str, Any] = {
        "zone": "yes", "null": "null", "count": "3", "when": "2026-01-02T03:04:05Z", "empty": "", "colon": "a: b",
        "breaks": "a\x85b\u2028c", "none": None, "free": 2, "ratio": 1e16, "ok": True, "list": [], "map": {}}
    text = as_yaml(data)
    assert text.splitlines()[0] == "zone: 'yes'"
    assert [line.split(":")[0] for line in text.splitlines()] == [f"'{k}'" if k == "null" else k for k in data]
    again = yaml.safe_load(text)
    assert again == data
    assert math.isclose(again["ratio"], 1e16)


def test_a_long_message_stays_on_one_line_in_yaml() -> None:
    message = "not accepted: " + "budget gpu.cozystack.io/total of tenant-a is spent; " * 5
    text = as_yaml({"message": message})
    assert len(text.splitlines()) == 1, text
    assert yaml.safe_load(text) == {"message": message}
