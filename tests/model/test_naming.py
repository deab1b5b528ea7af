from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from cozygpu.model.naming import template_device_name

SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
vmi_names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,250}[a-z0-9])?", fullmatch=True)
template_names = st.text(min_size=1, max_size=80)


def test_a_short_name_is_the_vmi_name_and_the_template_name_and_a_hash() -> None:
    assert re.fullmatch(r"vm1-gpu-[0-9a-f]{10}", template_device_name("vm1", "gpu"))


def test_two_vmis_whose_names_join_alike_get_different_devices() -> None:
    assert template_device_name("a-b", "c") != template_device_name("a", "b-c")


def test_a_long_name_keeps_a_readable_prefix_and_ends_in_a_stable_hash() -> None:
    name = template_device_name("a" * 200, "gpu")
    assert len(name) == 63
    assert name.startswith("a" * 40)
    assert re.fullmatch(r"[a-z]+-[0-9a-f]{10}", name)
    assert template_device_name("a" * 200, "gpu") == name


def test_the_hash_is_pinned_so_names_stay_stable_across_releases() -> None:
    assert template_device_name("vm.with.dots", "gpu") == "vm-with-dots-gpu-0f1c038d15"


@given(vmi_names, template_names)
def test_names_are_valid_subdomains_and_label_values_for_any_vmi_name_length(vmi: str, template: str) -> None:
    name = template_device_name(vmi, template)
    assert len(name) <= 63
    assert SUBDOMAIN.fullmatch(name)
    assert LABEL_VALUE.fullmatch(name)


@given(vmi_names, template_names, template_names)
def test_two_templates_of_one_vmi_never_share_a_name(vmi: str, first: str, second: str) -> None:
    if first != second:
        assert template_device_name(vmi, first) != template_device_name(vmi, second)


@given(vmi_names, vmi_names, template_names)
def test_two_vmis_never_share_a_template_device(first: str, second: str, template: str) -> None:
    if first != second:
        assert template_device_name(first, template) != template_device_name(second, template)
