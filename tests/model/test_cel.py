"""The restricted CEL evaluator for DRA device selectors, against NVIDIA-shaped ResourceSlice devices."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cozygpu.model.cel import MAX_EXPRESSION_BYTES, MAX_NESTING, CelError, DeviceAttrs, Version, compile

NVIDIA = "gpu.nvidia.com"
VFIO_CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'"
GPU = "device.attributes['gpu.nvidia.com']"


def slice_device(
    *, name: str = "gpu-0", type_: str = "vfio", product: str = "NVIDIA H100 80GB HBM3", **extra: Any
) -> dict[str, Any]:
    """A device as NVIDIA's driver publishes it in a ResourceSlice (resource.k8s.io/v1)."""
    attributes: dict[str, Any] = {
        "type": {"string": type_},
        "productName": {"string": product},
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
        "numaNode": {"int": 0},
        "driverVersion": {"version": "580.65.6"},
    }
    attributes.update(extra.pop("attributes", {}))
    return {"name": name, "attributes": attributes, "capacity": {"addressableMemory": {"value": "80Gi"}}, **extra}


def gpu(*, driver: str = NVIDIA, **fields: Any) -> DeviceAttrs:
    return DeviceAttrs.from_slice_device(driver, slice_device(**fields))


def matches(expression: str, device: DeviceAttrs | None = None) -> bool:
    return compile(expression).matches(device or gpu())


# --- the NVIDIA DeviceClass and the slice shape ---------------------------------------------------------------------


def test_nvidias_vfio_class_matches_a_vfio_gpu_and_neither_a_gpu_of_another_type_nor_another_driver() -> None:
    assert matches(VFIO_CLASS, gpu())
    assert not matches(VFIO_CLASS, gpu(type_="gpu"))
    assert not matches(VFIO_CLASS, gpu(driver="dra.example.com"))


def test_unqualified_slice_names_go_to_the_drivers_domain_and_qualified_ones_to_their_own() -> None:
    device = gpu()
    assert device.attributes[NVIDIA]["type"] == "vfio"
    assert device.attributes[NVIDIA]["numaNode"] == 0
    assert device.attributes[NVIDIA]["driverVersion"] == Version(580, 65, 6)
    assert device.attributes["resource.kubernetes.io"] == {"pciBusID": "0000:3b:00.0", "pcieRoot": "pci0000:3a"}
    assert device.capacity == {NVIDIA: {"addressableMemory": 80 * 2**30}}
    assert not device.allow_multiple_allocations


def test_a_fractional_capacity_stays_exact_and_allow_multiple_allocations_is_read() -> None:
    raw = slice_device(allowMultipleAllocations=True)
    raw["capacity"]["cores"] = {"value": "1500m"}
    device = DeviceAttrs.from_slice_device(NVIDIA, raw)
    assert device.capacity[NVIDIA]["cores"] == Fraction(3, 2)
    assert device.allow_multiple_allocations
    assert matches("device.allowMultipleAllocations", device)
    assert matches(f"device.capacity['{NVIDIA}'].cores.isGreaterThan(quantity('1'))", device)


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ({"version": "v1.2"}, "not a semantic version"),
        ({"int": "3"}, "no int, bool, string or version"),
        ({}, "no int, bool, string or version"),
    ],
)
def test_a_slice_attribute_without_a_readable_value_makes_the_device_unreadable(
    attribute: dict[str, Any], message: str
) -> None:
    with pytest.raises(CelError, match=f"unreadable device: 'gpu-0' attribute 'odd'.*{message}"):
        gpu(attributes={"odd": attribute})


def test_a_list_valued_attribute_is_left_out_rather_than_failing_the_device() -> None:
    device = gpu(attributes={"modes": {"strings": ["a", "b"]}})
    assert "modes" not in device.attributes[NVIDIA]
    assert matches(VFIO_CLASS, device)


def test_an_unreadable_capacity_makes_the_device_unreadable() -> None:
    raw = slice_device()
    raw["capacity"]["addressableMemory"] = {"value": "lots"}
    with pytest.raises(CelError, match="unreadable device: 'gpu-0' capacity 'addressableMemory'"):
        DeviceAttrs.from_slice_device(NVIDIA, raw)


# --- each construct -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # literals and equality
        ("true", True),
        ("false", False),
        ("1 == 1", True),
        ("0x10 == 16", True),
        ("-1 < 0", True),
        ("'a' == \"a\"", True),
        (r"'it\'s' == " + '"it' + "'s\"", True),
        (r"'a\\b\n\t\r' != 'a'", True),
        ("false < true", True),
        # device fields
        ("device.driver == 'gpu.nvidia.com'", True),
        ("device.driver != 'gpu.nvidia.com'", False),
        ("!device.allowMultipleAllocations", True),
        (f"{GPU}.numaNode == 0", True),
        (f"{GPU}['numaNode'] >= 0", True),
        (f"{GPU}.numaNode > 0", False),
        (f"{GPU}.numaNode <= -1", False),
        (f"{GPU}.productName < 'O'", True),
        ("device.attributes['resource.kubernetes.io'].pciBusID == '0000:3b:00.0'", True),
        # heterogeneous equality is false, as in CEL
        (f"{GPU}.numaNode == 'zero'", False),
        (f"{GPU}.numaNode != true", True),
        (f"{GPU}.type == 1", False),
        # logic and parentheses
        ("true && !false", True),
        ("!(true && false) || false", True),
        ("(false || false) && true", False),
        ("!!true", True),
        # membership and presence
        (f"{GPU}.type in ['vfio', 'gpu']", True),
        (f"{GPU}.type in ['gpu', 'mig']", False),
        (f"{GPU}.numaNode in [0, 1]", True),
        (f"{GPU}.numaNode in ['0']", False),
        (f"{GPU}.type in []", False),
        (f"{GPU}.type in [device.driver, 'vfio']", True),
        ("'pcieRoot' in device.attributes['resource.kubernetes.io']", True),
        (f"'pcieRoot' in {GPU}", False),
        ("'anything' in device.attributes['unknown.example.com']", False),
        ("'addressableMemory' in device.capacity['gpu.nvidia.com']", True),
        (f"has({GPU}.productName)", True),
        (f"has({GPU}.memoryBandwidth)", False),
        ("has(device.attributes['unknown.example.com'].x)", False),
        ("has(device.capacity['gpu.nvidia.com'].addressableMemory)", True),
        # string methods
        (f"{GPU}.productName.startsWith('NVIDIA H100')", True),
        (f"{GPU}.productName.endsWith('HBM3')", True),
        (f"{GPU}.productName.contains('A100')", False),
        (f"{GPU}.productName.lowerAscii() == 'nvidia h100 80gb hbm3'", True),
        ("'ÄB'.lowerAscii() == 'Äb'", True),
        # versions
        (f"{GPU}.driverVersion.compareTo(semver('580.0.0')) > 0", True),
        (f"{GPU}.driverVersion.compareTo(semver('580.65.6')) == 0", True),
        (f"{GPU}.driverVersion.isGreaterThan(semver('600.0.0'))", False),
        (f"{GPU}.driverVersion.isLessThan(semver('600.0.0'))", True),
        (f"{GPU}.driverVersion == semver('580.65.6+build.7')", True),
        ("semver('1.2.3') == semver('1.2.3')", True),
        # quantities
        ("device.capacity['gpu.nvidia.com'].addressableMemory.compareTo(quantity('80Gi')) == 0", True),
        ("device.capacity['gpu.nvidia.com'].addressableMemory.isGreaterThan(quantity('40Gi'))", True),
        ("device.capacity['gpu.nvidia.com'].addressableMemory.isLessThan(quantity('80G'))", False),
        ("device.capacity['gpu.nvidia.com'].addressableMemory == quantity('81920Mi')", True),
        ("device.capacity['gpu.nvidia.com'].addressableMemory.compareTo(quantity('1Ti')) < 0", True),
        # comments and whitespace
        ("// the class\n  device.driver ==\n 'gpu.nvidia.com'", True),
    ],
)
def test_each_construct_evaluates_as_cel_does(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


def test_an_unknown_domain_reads_as_an_empty_map_but_a_missing_name_is_an_error() -> None:
    assert not matches("'x' in device.attributes['unknown.example.com']")
    expression = "device.attributes['unknown.example.com'].x == 1"
    at = expression.index("x ==")
    with pytest.raises(CelError, match=rf"evaluation error at {at}: no such key 'x' in device.attributes\['unknown"):
        matches(expression)


def test_semver_precedence_follows_semver_org() -> None:
    ordered = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11"]
    ordered += ["1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "2.0.0"]
    for lower, higher in itertools.pairwise(ordered):
        assert matches(f"semver('{lower}').isLessThan(semver('{higher}'))"), (lower, higher)
        assert matches(f"semver('{higher}').compareTo(semver('{lower}')) == 1"), (lower, higher)


def test_compiled_selectors_are_cached_per_expression() -> None:
    assert compile(VFIO_CLASS) is compile(VFIO_CLASS)


# --- errors at evaluation -------------------------------------------------------------------------------------------

MISSING = f"{GPU}.missing"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f"{MISSING} || true", True),
        (f"true || {MISSING}", True),
        (f"{MISSING} && false", False),
        (f"false && {MISSING}", False),
        (f"{MISSING} || {GPU}.numaNode || true", True),
        (f"{GPU}.type && false", False),
    ],
)
def test_and_and_or_are_commutative_over_errors(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


@pytest.mark.parametrize(
    "expression", [f"{MISSING} || false", f"false || {MISSING}", f"{MISSING} && true", f"true && {MISSING}"]
)
def test_an_error_nothing_decides_is_raised(expression: str) -> None:
    with pytest.raises(CelError, match="no such key 'missing'"):
        matches(expression)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (f"{MISSING} == 'x'", f"evaluation error at {len(GPU) + 1}: no such key 'missing'"),
        (f"{GPU}.numaNode < 'a'", f"evaluation error at {len(GPU) + 10}: no such overload: int < string"),
        (f"{GPU}.numaNode.startsWith('0')", "no such overload: int.startsWith"),
        (f"{GPU}.driverVersion == 'x'", "no such overload: semver == string"),
        (f"{GPU}.driverVersion in ['x']", "no such overload: semver == string"),
        (f"{GPU}.driverVersion < {GPU}.driverVersion", "no such overload: semver < semver"),
        (f"{GPU}.type.compareTo(semver('1.0.0')) == 0", "no such overload: string.compareTo"),
        (f"!{GPU}.type", "'!' needs bool, not string"),
        (f"{GPU}.type", "must evaluate to bool, not string"),
        (f"semver({GPU}.type) == semver('1.0.0')", "'vfio' is not a semantic version"),
    ],
)
def test_a_missing_attribute_or_a_type_mismatch_is_an_evaluation_error(expression: str, message: str) -> None:
    selector = compile(expression)  # compiles: the attribute's type is only known per device
    with pytest.raises(CelError, match=message):
        selector.matches(gpu())


# --- refusals -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "at", "message"),
    [
        (f"{GPU}.type.exists(x, x == 'a')", "exists", "unsupported .*macro exists\\(\\)"),
        ("['a'].all(x, x == 'a')", "all", "unsupported .*macro all\\(\\)"),
        ("['a'].map(x, x) == ['a']", "map", "unsupported .*macro map\\(\\)"),
        (f"cel.bind(g, {GPU}, g.type == 'vfio')", "cel", "unsupported .*cel.bind"),
        ("true ? true : false", "?", "unsupported .*conditional"),
        (f"{GPU}.numaNode + 1 == 1", "+", "unsupported .*arithmetic '\\+'"),
        (f"{GPU}.numaNode == 2 * 1", "*", "unsupported .*arithmetic '\\*'"),
        (f"-{GPU}.numaNode == 0", "-", "unsupported .*negation"),
        ("1.5 == 1.5", "1.5", "unsupported .*double"),
        ("1u == 1u", "1u", "unsupported .*unsigned"),
        ("r'a' == 'a'", "r'", "unsupported .*raw or bytes"),
        ("'''a''' == 'a'", "'''", "unsupported .*triple-quoted"),
        (r"'\x41' == 'A'", "\\x", "unsupported .*escape"),
        ("{'a': 1} == {'a': 1}", "{", "unsupported .*map or message literal"),
        (f"{GPU}.type == null", "null", "unsupported .*null"),
        (f"size({GPU}.type) == 4", "size", "unsupported .*function size\\(\\)"),
        (f"{GPU}.type.matches('^v')", "matches", "unsupported .*method matches\\(\\)"),
        ("self.type == 'vfio'", "self", "unsupported .*identifier 'self'"),
        ("device.attributes.size() == 1", "size", "unsupported .*method size\\(\\)"),
        ("device.capacity.gpu == 1", "capacity", "unsupported .*device.capacity not indexed by a domain"),
        (f"{GPU} == {GPU}", "[", "unsupported .*domain map"),
        (f"{GPU}.type[0] == 'v'", "[0", "unsupported .*indexing"),
        (f"{GPU}.type.length == 4", "length", "unsupported .*field 'length' of a value"),
        ("device.attributes[device.driver].type == 'vfio'", "driver]", "unsupported .*not a string literal"),
        (f"{GPU}.type in {GPU}.modes", "modes", "unsupported .*'in' anything but"),
        (f"has({GPU}['type'])", "['type']", "unsupported .*has\\(\\) of"),
        ("['a'] == ['a']", "[", "unsupported .*a list anywhere"),
        (".device.driver == 'x'", ".", "unsupported .*leading '.'"),
    ],
)
def test_a_construct_outside_the_subset_is_refused_at_its_position(expression: str, at: str, message: str) -> None:
    with pytest.raises(CelError, match=message) as refused:
        compile(expression)
    assert refused.value.position == expression.index(at)
    assert str(refused.value).startswith(f"unsupported at {expression.index(at)}: ")


@pytest.mark.parametrize(
    ("expression", "at", "message"),
    [
        ("device.driver = 'x'", "=", "syntax error .*unexpected character '='"),
        ("(true", "", "syntax error .*expected '\\)'"),
        ("'unterminated", "'", "syntax error .*unexpected character"),
        ("true false", "false", "syntax error .*unexpected 'false'"),
        ("device.driver ==", "", "syntax error .*unexpected end"),
        ("device. == 'x'", "==", "syntax error .*expected a field or method name"),
        ("9223372036854775808 > 0", "9", "syntax error .*out of range"),
        ("device.driver == 1", "==", "type error .*no such overload: string == int"),
        ("device.driver < semver('1.0.0')", "<", "type error .*no such overload: string < version"),
        ("semver('1.0.0') < semver('2.0.0')", "<", "type error .*'<' needs int or string or bool, not version"),
        (f"{GPU}.driverVersion < semver('2.0.0')", "<", "type error .*'<' needs int or string or bool, not version"),
        ("device.capacity['gpu.nvidia.com'].addressableMemory == 80", "==", "type error .*quantity == int"),
        ("1 && true", "1", "type error .*'&&' needs bool, not int"),
        ("device.driver", "device", "type error .*a selector needs bool, not string"),
        ("device.driver.lowerAscii(1) == 'x'", "lowerAscii", "type error .*takes 0 argument"),
        ("device.nodeName == 'x'", "nodeName", "type error .*device has no field 'nodeName'"),
        ("semver('1.0.0').compareTo(quantity('1')) == 0", "compareTo", "type error .*version.compareTo\\(quantity"),
        ("device.driver in [1, 'a']", "[", "type error .*a list mixes int, string"),
        ("semver('v1.0.0') == semver('1.0.0')", "'v1", "evaluation error .*'v1.0.0' is not a semantic version"),
        ("quantity('1 Gi').isLessThan(quantity('2Gi'))", "'1", "evaluation error .*unknown suffix"),
    ],
)
def test_a_malformed_or_ill_typed_expression_is_refused_at_compile_time(
    expression: str, at: str, message: str
) -> None:
    position = expression.index(at) if at else len(expression)
    with pytest.raises(CelError, match=message) as refused:
        compile(expression)
    assert refused.value.position == position


def test_the_expression_may_be_as_long_as_the_apis_limit_and_no_longer() -> None:
    padded = "true" + " " * (MAX_EXPRESSION_BYTES - 4)
    assert compile(padded).matches(gpu())
    with pytest.raises(CelError, match=f"unsupported at {MAX_EXPRESSION_BYTES}: {MAX_EXPRESSION_BYTES + 1} bytes"):
        compile(padded + " ")
    # The limit counts UTF-8 bytes, as the API does: a two-byte character in a string literal counts twice.
    with pytest.raises(CelError, match="over the limit"):
        compile(f"'{'é' * (MAX_EXPRESSION_BYTES // 2)}' != ''")


def test_a_long_chain_of_or_is_flat_and_evaluates_without_deep_recursion() -> None:
    chain = "false || " * ((MAX_EXPRESSION_BYTES - 4) // 9) + "true"
    assert len(chain) <= MAX_EXPRESSION_BYTES
    assert compile(chain).matches(gpu())


@pytest.mark.parametrize(
    ("make", "unit"),
    [
        (lambda depth: "(" * depth + "true" + ")" * depth, "("),
        (lambda depth: "[" * depth + "]" * depth, "["),
        (lambda depth: "!" * depth + "true", "!"),
        (lambda depth: "true" + " == true" * depth, "=="),
    ],
)
def test_nesting_deeper_than_the_bound_is_refused_before_it_is_parsed(make: Callable[[int], str], unit: str) -> None:
    deep = make(MAX_NESTING + 1)
    with pytest.raises(CelError, match=f"unsupported at .*: nesting deeper than {MAX_NESTING}"):
        compile(deep)
    if unit != "[":  # a list is only a value on the right of 'in'
        assert compile(make(MAX_NESTING)).matches(gpu()) is (unit != "!" or MAX_NESTING % 2 == 0)


# --- properties -----------------------------------------------------------------------------------------------------

_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def literal(value: int | str) -> str:
    if isinstance(value, int):
        return str(value)
    escaped = value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\t", "\\t")
    return f"'{escaped.replace(chr(13), chr(92) + 'r')}'"


_SCALARS = st.one_of(
    st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.text(alphabet="ab'\"\\\n\t\rZé", max_size=6), st.text(alphabet="ab'\"\\\n\t\rZé", max_size=6)),
)


@given(pair=_SCALARS, op=st.sampled_from(sorted(_OPERATORS)), through_attribute=st.booleans())
def test_a_comparison_of_two_literals_agrees_with_python(
    pair: tuple[int, int] | tuple[str, str], op: str, through_attribute: bool
) -> None:
    left, right = pair
    device = gpu(attributes={"x": {"int": left} if isinstance(left, int) else {"string": left}})
    left_side = f"{GPU}.x" if through_attribute else literal(left)
    assert compile(f"{left_side} {op} {literal(right)}").matches(device) is _OPERATORS[op](left, right)


ERROR = "error"
_ATOMS = {
    "true": True,
    "false": False,
    f"{GPU}.numaNode == 0": True,
    f"{GPU}.type != 'vfio'": False,
    f"{GPU}.missing": ERROR,
    f"{GPU}.type": ERROR,  # a string where a bool is needed
}


def _reference_or(values: list[Any]) -> Any:
    return True if True in values else ERROR if ERROR in values else False


def _reference_and(values: list[Any]) -> Any:
    return False if False in values else ERROR if ERROR in values else True


_TREES = st.recursive(
    st.sampled_from(sorted(_ATOMS)).map(lambda atom: (atom, _ATOMS[atom])),
    lambda inner: st.one_of(
        inner.map(lambda sub: (f"!({sub[0]})", ERROR if sub[1] == ERROR else not sub[1])),
        st.lists(inner, min_size=2, max_size=4).map(
            lambda subs: ("(" + " || ".join(s[0] for s in subs) + ")", _reference_or([s[1] for s in subs]))
        ),
        st.lists(inner, min_size=2, max_size=4).map(
            lambda subs: ("(" + " && ".join(s[0] for s in subs) + ")", _reference_and([s[1] for s in subs]))
        ),
    ),
    max_leaves=12,
)


@given(tree=_TREES)
def test_logic_follows_cels_three_valued_truth_tables_and_not_negates(tree: tuple[str, Any]) -> None:
    expression, expected = tree
    device = gpu()
    if expected == ERROR:
        with pytest.raises(CelError):
            compile(expression).matches(device)
        with pytest.raises(CelError):
            compile(f"!({expression})").matches(device)
    else:
        assert compile(expression).matches(device) is expected
        assert compile(f"!({expression})").matches(device) is (not expected)
