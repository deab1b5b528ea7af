"""The chart's alert and recording rules under promtool: they load, and each has a unit test that holds.

The rule file is the PrometheusRule's ``spec.groups`` as helm renders the
chart (``prometheus.render_rules``, the same file the local plane's Prometheus
loads), written as ``rules.yaml`` beside copies of the unit tests in
``tests/chart/promtool/`` (which name it so). Every alert needs a test case in
which it fires and one in which it stays silent, every recording rule a
``promql_expr_test`` of its name: a rule added to the chart without them fails
here, and so does a test of a rule the chart no longer has.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from cozygpu.devcluster import binaries, prometheus
from tests.support.planes import unavailable

UNIT_TESTS = Path(__file__).parent / "promtool"


def prometheus_binaries() -> binaries.PrometheusBinaries:
    """The cached prometheus and promtool: a test without them skips, or fails under ``CI=true``."""
    found = binaries.find_prometheus()
    if found is None:
        unavailable("prometheus and promtool are not built")
        raise AssertionError("unreachable")
    return found


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(prometheus_binaries().promtool), *args], input=stdin, capture_output=True,
                          text=True, check=False, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def groups() -> list[dict[str, Any]]:
    return prometheus.render_rules()


@pytest.fixture
def rule_dir(groups: list[dict[str, Any]], tmp_path: Path) -> Path:
    """The rendered rules as ``rules.yaml`` beside copies of the unit tests."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    for test in sorted(UNIT_TESTS.glob("*.test.yaml")):
        shutil.copy(test, tmp_path / test.name)
    return tmp_path


def unit_tests() -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) for path in sorted(UNIT_TESTS.glob("*.test.yaml"))]


def untested(groups: Sequence[Mapping[str, Any]], tests: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the unit tests leave out: an alert never seen firing or never seen silent, a recording rule no
    expression test reads, a test of an alert the rules do not have."""
    alerts = {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}
    records = {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}
    cases = [case for test in tests for group in test.get("tests") or () for case in group.get("alert_rule_test") or ()]
    exprs = [case["expr"] for test in tests for group in test.get("tests") or ()
             for case in group.get("promql_expr_test") or ()]
    fires = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    problems = [f"alert {name}: no test case in which it fires" for name in sorted(alerts - fires)]
    problems += [f"alert {name}: no test case in which it stays silent" for name in sorted(alerts - silent)]
    problems += [f"recording rule {name}: no promql_expr_test reads it" for name in sorted(records)
                 if not any(re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr) for expr in exprs)]
    problems += [f"a test of alert {name}, which the chart's rules do not have" for name in sorted((fires | silent)
                                                                                                  - alerts)]
    return problems


def test_the_rendered_rules_pass_promtool_check_rules(rule_dir: Path, groups: list[dict[str, Any]]) -> None:
    assert [rule for group in groups for rule in group["rules"]], "the chart rendered no rule"
    checked = promtool("check", "rules", "--lint=all", "--lint-fatal", str(rule_dir / "rules.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules = sum(len(group["rules"]) for group in groups)
    assert f"SUCCESS: {rules} rules found" in checked.stdout


def test_every_rule_holds_under_its_promtool_unit_tests(rule_dir: Path) -> None:
    files = sorted(path.name for path in rule_dir.glob("*.test.yaml"))
    assert files, f"no unit tests in {UNIT_TESTS}"
    tested = promtool("test", "rules", *files, cwd=rule_dir)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert tested.stdout.count("SUCCESS") == len(files), tested.stdout


def test_every_alert_and_recording_rule_of_the_chart_has_a_unit_test(groups: list[dict[str, Any]]) -> None:
    assert untested(groups, unit_tests()) == []


def test_a_rule_added_without_a_test_is_named() -> None:
    tests = [{"tests": [{"alert_rule_test": [
        {"alertname": "Tested", "exp_alerts": [{"exp_labels": {}}]}, {"alertname": "Tested", "exp_alerts": []},
        {"alertname": "OnlyFires", "exp_alerts": [{"exp_labels": {}}]},
        {"alertname": "Gone", "exp_alerts": []},
    ], "promql_expr_test": [{"expr": "sum(job:read:rate5m)"}]}]}]
    groups = [{"name": "g", "rules": [
        {"alert": "Tested", "expr": "x > 0"}, {"alert": "OnlyFires", "expr": "x > 0"},
        {"alert": "Untested", "expr": "x > 0"},
        {"record": "job:read:rate5m", "expr": "rate(x[5m])"}, {"record": "job:write:rate5m", "expr": "rate(y[5m])"},
    ]}]
    assert untested(groups, tests) == [
        "alert Untested: no test case in which it fires",
        "alert OnlyFires: no test case in which it stays silent",
        "alert Untested: no test case in which it stays silent",
        "recording rule job:write:rate5m: no promql_expr_test reads it",
        "a test of alert Gone, which the chart's rules do not have",
    ]


def test_a_failing_unit_test_fails_promtool(rule_dir: Path) -> None:
    """The unit tests can fail: the stale-report alert expected for a node whose agent reports every minute."""
    test = yaml.safe_load((UNIT_TESTS / "agent-report-stale.test.yaml").read_text())
    case = test["tests"][0]["alert_rule_test"][1]
    case["exp_alerts"][0]["exp_labels"]["node"] = "gpu-2"
    (rule_dir / "wrong.test.yaml").write_text(yaml.safe_dump(test))
    tested = promtool("test", "rules", "wrong.test.yaml", cwd=rule_dir)
    assert tested.returncode != 0
    assert 'node="gpu-1"' in tested.stdout + tested.stderr
