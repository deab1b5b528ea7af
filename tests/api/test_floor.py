"""Admission and the binder read Kubernetes JSON only through the typed floor (``cozygpu.api``), never by a
field name of their own.

The rule, over every module of ``cozygpu/admission/`` and ``cozygpu/binder/``: no subscript read
with a string constant (``obj["spec"]``) and no ``.get`` with a string
constant (``spec.get("count")``). A field's name, its type check and what a
malformed value reads as live in one reader of ``cozygpu/api/``; a webhook
asks that reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "cozygpu"
#: The behaviour code: what decides reads the floor.
BEHAVIOUR = ("admission", "binder")


def raw_reads(source: str) -> list[str]:
    """The raw JSON reads of a module's source: ``x["field"]`` loads and ``x.get("field")`` calls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Subscript | ast.Call):
            continue
        subscript = (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
                     and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str))
        get = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
               and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))
        if subscript or get:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_rule_sees_a_subscript_and_a_get_by_field_name_but_not_a_write_or_a_variable() -> None:
    source = 'a = obj["spec"]\nb = spec.get("count", 0)\nout["x"] = 1\nc = obj[name]\nd = cache.get(ns, name)\n'
    assert raw_reads(source) == ["1: obj['spec']", "2: spec.get('count', 0)"]


@pytest.mark.parametrize("package", BEHAVIOUR)
def test_no_behaviour_module_reads_raw_json_by_field_name(package: str) -> None:
    modules = sorted((PACKAGE / package).glob("*.py"))
    assert modules
    found = {path.name: reads for path in modules if (reads := raw_reads(path.read_text()))}
    assert found == {}, f"read these through cozygpu.api: {found}"
