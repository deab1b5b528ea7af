"""Refusals are built in ``model/refusals.py`` only: admission and the binder pass them on, never write their own.

Why: a person reads the same decision in a webhook's 403, a ``bindAnswer``,
a condition and ``cozygpu why``; a message or a reason code written at a call
site drifts from the others (the module contract of ``model/refusals.py``).

The rule, over every module of ``cozygpu/admission/``, ``cozygpu/binder/`` and ``cozygpu/commands/`` (what
``cozygpu why`` prints is the same refusal):

1. No ``Refusal(...)`` is constructed there, and no ``evolve(...)`` rewrites
   a ``message`` or ``reason``: a refusal comes from a constructor of
   ``cozygpu.model.refusals``.
2. A refusal sink (``Refused(...)``, ``<x>.refuse(...)``) gets exactly one
   positional argument and no keyword: a name, an attribute, or a call of a
   ``cozygpu.model.refusals`` constructor. Never a string literal, an
   f-string, a concatenation, ``str(...)`` or ``reason="..."``. No
   ``Verdict(...)`` is built directly (its classmethods make the answers),
   and no call gets ``reason=`` as a string literal or f-string (a metric's
   ``.labels(...)`` aside).
3. In ``cozygpu/admission/``, no string literal in code is a ``Reason``
   value: a reason code is a ``Reason`` member, picked by its constructor
   (this catches ``return ("DeviceGone", f"...")`` and ``reason = "X"``).
   The binder is left out of this one: it writes Kubernetes' own reasons
   (a synthetic ``Conflict`` status) that happen to share a value.
4. The sinks' signatures take a ``Refusal`` (so mypy refuses a string there),
   and the webhooks' answers that are not refusals (not ready, internal
   error) carry reasons that are not ``Reason`` values.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from cozygpu.admission.envelope import Verdict
from cozygpu.admission.vmi_plan import Refused
from cozygpu.model.refusals import Reason, Refusal

PACKAGE = Path(__file__).resolve().parents[2] / "cozygpu"
SCOPES = ("admission", "binder", "commands")
#: Where rule 3 applies.
REASON_LITERAL_SCOPES = ("admission",)
REFUSALS_MODULE = "cozygpu.model.refusals"
REASON_VALUES = frozenset(str(r) for r in Reason)


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _refusal_names(tree: ast.Module) -> set[str]:
    """Names a module imports from ``cozygpu.model.refusals`` (its constructors), and the module's own alias."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == REFUSALS_MODULE:
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "cozygpu.model":
            names |= {a.asname or a.name for a in node.names if a.name == "refusals"}
    return names


def _is_constructor_call(node: ast.expr, imported: set[str]) -> bool:
    """A call of a constructor function of ``cozygpu.model.refusals`` (``refusals.x(...)`` or an imported ``x``)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        name, ok = func.attr, func.value.id == "refusals" and "refusals" in imported
    else:
        name, ok = _callee(node), isinstance(func, ast.Name) and func.id in imported
    return ok and name not in {"Refusal", "Reason"}


def _is_text(node: ast.expr) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _findings(path: Path, *, reason_literals: bool) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = _refusal_names(tree)
    where = str(path.relative_to(PACKAGE))
    found: list[str] = []
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _callee(node)
            if name == "Refusal":
                found.append(f"{where}:{node.lineno}: Refusal(...) built here, not in {REFUSALS_MODULE}")
            elif name == "evolve" and any(k.arg in {"message", "reason"} for k in node.keywords):
                found.append(f"{where}:{node.lineno}: evolve(...) rewrites a refusal's message or reason")
            elif name == "Verdict":
                found.append(f"{where}:{node.lineno}: Verdict(...) built directly, not by its classmethods")
            elif name in {"Refused", "refuse"}:
                args_ok = len(node.args) == 1 and not node.keywords
                arg = node.args[0] if node.args else None
                if not args_ok or not (isinstance(arg, ast.Name | ast.Attribute)
                                       or (arg is not None and _is_constructor_call(arg, imported))):
                    shown = ast.unparse(node)
                    found.append(f"{where}:{node.lineno}: {name}(...) is given text, not a Refusal from "
                                 f"{REFUSALS_MODULE}: {shown[:100]}")
            if name != "labels" and any(k.arg == "reason" and _is_text(k.value) for k in node.keywords):
                found.append(f"{where}:{node.lineno}: {name}(reason=...) is given a string, not a Reason")
        elif (reason_literals and isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value in REASON_VALUES and id(node) not in docstrings):
            found.append(f"{where}:{node.lineno}: reason {node.value!r} written as a string, not a Reason member")
    return found


def test_admission_and_the_binder_pass_refusals_on_and_never_write_their_own() -> None:
    found: list[str] = []
    for scope in SCOPES:
        for path in sorted((PACKAGE / scope).rglob("*.py")):
            found += _findings(path, reason_literals=scope in REASON_LITERAL_SCOPES)
    assert found == [], "refusals built outside model/refusals.py:\n" + "\n".join(found)


def test_the_sinks_take_a_refusal_and_the_answers_that_are_not_refusals_carry_no_refusal_reason() -> None:
    for sink in (Verdict.refuse, Refused.__init__):
        params = [p for p in inspect.signature(sink, eval_str=True).parameters.values() if p.name != "self"]
        assert [p.annotation for p in params] == [Refusal], f"{sink.__qualname__} takes {params}"
    for verdict in (Verdict.not_ready("x"), Verdict.internal_error("x")):
        assert not verdict.allowed
        assert verdict.reason, verdict
        assert verdict.reason not in REASON_VALUES, verdict
