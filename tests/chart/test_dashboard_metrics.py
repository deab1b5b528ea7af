"""The dashboard queries only what a real controller exports, and that export passes ``promtool check metrics``.

The known names are the sample names of a live ``/metrics`` of a leading
controller with GPU on after a full binder pass (``live_metrics``: every
family's TYPE line, so a histogram's ``_bucket``/``_sum``/``_count`` and a
counter's ``_total`` count even with no child set), the series Prometheus
writes itself (``up``, ``ALERTS``, ...), and the chart's recording rules. The
used names are every identifier of each panel's PromQL that is neither a
function, an aggregation, a keyword nor a label name (``promql_names``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from cozygpu.devcluster import apply, prometheus
from cozygpu.devcluster.plane import ControlPlane
from cozygpu.kube import Client
from tests.chart.test_observability import exported, live_metrics
from tests.chart.test_promtool import promtool

DASHBOARD = apply.chart_dir() / "dashboards" / "cozygpu.json"
#: Series Prometheus writes itself, per target and for alerts.
SYNTHETIC = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added",
                       "scrape_samples_post_metric_relabeling", "ALERTS", "ALERTS_FOR_STATE"})
KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                      "offset", "bool", "atan2", "inf", "nan"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_NUMBER = re.compile(r"(?<![\w:.])(?:0x[0-9a-fA-F]+|\d*\.?\d+(?:[eE][+-]?\d+)?[a-z]*)")
_IDENTIFIER = re.compile(r"[A-Za-z_:][\w:]*")


def promql_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects by name (a ``{__name__=...}`` selector is not read)."""
    text = _VARIABLE.sub(" ", _STRING.sub(" ", expr))
    text = _LABEL_LIST.sub(" ", _RANGE.sub(" ", _MATCHERS.sub(" ", text)))
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        called = text[match.end():].lstrip().startswith("(")  # a function, or an aggregation like sum (...)
        if not called and match.group().lower() not in KEYWORDS:
            names.add(match.group())
    return names


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel with queries, rows' nested panels included."""
    found = []
    for panel in board["panels"]:
        found += [panel, *panels(panel)] if "panels" in panel else [panel]
    return [panel for panel in found if panel.get("targets")]


def recording_rules() -> set[str]:
    return {rule["record"] for group in prometheus.render_rules() for rule in group["rules"] if "record" in rule}


def unknown(board: dict[str, Any], known: set[str]) -> list[str]:
    return [f"panel {panel['title']!r} queries {name}, which the controller does not export"
            for panel in panels(board) for target in panel["targets"]
            for name in sorted(promql_names(target["expr"]) - known)]


def test_promql_names_are_the_metrics_an_expression_selects() -> None:
    assert promql_names(
        'histogram_quantile(0.99, sum by (le, loop) (rate(cozygpu_pass_duration_seconds_bucket{loop=~"b.*"}[5m])))'
    ) == {"cozygpu_pass_duration_seconds_bucket"}
    assert promql_names(
        'sum by (class) (a_units{state="free"} * on (instance) group_left (node) (is_leader == 1)) > 0.5e3'
    ) == {"a_units", "is_leader"}
    assert promql_names("time() - max without (pod) (stamp_seconds offset 5m) and bool on() vector(1)") == {
        "stamp_seconds"}
    assert promql_names("sum(rate(x_total[$__rate_interval])) / ignoring (le) job:x:rate5m unless up") == {
        "x_total", "job:x:rate5m", "up"}


def test_a_panel_querying_a_name_nobody_exports_is_named() -> None:
    board = {"panels": [{"type": "row", "title": "Row", "panels": [
        {"title": "Good", "targets": [{"expr": "sum(up)"}]},
        {"title": "Typo", "targets": [{"expr": 'cozygpu_binder_class_unit{state="free"}'}]},
    ]}]}
    assert unknown(board, {"up", "cozygpu_binder_class_units"}) == [
        "panel 'Typo' queries cozygpu_binder_class_unit, which the controller does not export"]


def test_every_panel_query_parses_as_promql(tmp_path: Path) -> None:
    """Each panel's expression, as a recording rule promtool checks (a query Prometheus cannot parse fails)."""
    board = json.loads(DASHBOARD.read_text())
    rules = [{"record": f"panel:{i}:{j}", "expr": target["expr"]}
             for i, panel in enumerate(panels(board)) for j, target in enumerate(panel["targets"])]
    assert len(rules) >= 10
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    checked = promtool("check", "rules", str(tmp_path / "panels.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_check_metrics_names_what_breaks_the_conventions() -> None:
    page = "".join(f"# HELP {name} A figure\n# TYPE {name} gauge\n{name} 1\n"
                   for name in ("cozygpu_things_total", "cozygpu_wait_milliseconds"))
    checked = promtool("check", "metrics", stdin=page)
    assert checked.returncode != 0
    assert 'cozygpu_things_total non-counter metrics should not have "_total" suffix' in checked.stderr
    assert 'cozygpu_wait_milliseconds use base unit "seconds"' in checked.stderr


async def test_promtool_check_metrics_passes_on_a_live_controller_page(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    page = await live_metrics(plane, admin, namespace, tmp_path)
    checked = promtool("check", "metrics", stdin=page)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout + checked.stderr == ""


async def test_every_metric_a_dashboard_panel_queries_is_one_the_controller_exports(
        plane: ControlPlane, admin: Client, namespace: str, tmp_path: Path) -> None:
    live = exported(await live_metrics(plane, admin, namespace, tmp_path))
    assert {"cozygpu_binder_answer_latency_seconds_bucket", "cozygpu_passes_total"} <= live
    board = json.loads(DASHBOARD.read_text())
    assert unknown(board, live | SYNTHETIC | recording_rules()) == []
    used = {name for panel in panels(board) for target in panel["targets"] for name in promql_names(target["expr"])}
    assert len(used) >= 10, used
