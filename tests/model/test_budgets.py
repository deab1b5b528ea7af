from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.model.budgets import BudgetLedger, budget_refusal, class_budget, read_budgets
from cozygpu.model.refusals import Reason
from cozygpu.model.snapshot import Phase
from tests.model.factories import H100, device, gpu_class, pod, snapshot

NAMES = frozenset({H100})


def test_budgets_are_read_from_requests_keys_and_bare_keys() -> None:
    budgets = read_budgets(
        "tenant-a",
        {"requests.gpu.cozystack.io/h100": "4", "gpu.cozystack.io/total": "6", "limits.gpu.cozystack.io/a10": "9"},
        NAMES,
    )
    assert budgets.per_class["h100"].amount == 4
    assert budgets.total is not None
    assert budgets.total.amount == 6
    assert "a10" not in budgets.per_class


def test_when_both_the_requests_key_and_the_bare_key_are_set_the_smaller_counts() -> None:
    budgets = read_budgets("tenant-a", {"requests.gpu.cozystack.io/h100": "4", "gpu.cozystack.io/h100": "2"}, NAMES)
    assert budgets.per_class["h100"].amount == 2


def test_an_unparseable_or_fractional_budget_is_kept_as_unreadable() -> None:
    budgets = read_budgets(
        "tenant-a", {"requests.gpu.cozystack.io/h100": "lots", "requests.gpu.cozystack.io/total": "1500m"}, NAMES
    )
    assert budgets.per_class["h100"].amount is None
    assert budgets.total is not None
    assert budgets.total.amount is None


def test_a_raw_key_is_a_requests_key_naming_an_effective_gpu_resource_name() -> None:
    budgets = read_budgets(
        "tenant-a", {f"requests.{H100}": "2", f"limits.{H100}": "2", "requests.example.com/nic": "1"}, NAMES
    )
    assert set(budgets.raw) == {H100}
    assert budgets.raw[H100].key == f"requests.{H100}"


def test_a_budget_caps_the_whole_subtree_of_the_tenant_that_declares_it() -> None:
    snap = snapshot(
        devices=[
            device("d1", namespace="tenant-a-b", count=2, phase=Phase.BOUND, node="n1"),
            device("d2", namespace="tenant-a-c", count=1, phase=Phase.BOUND, node="n1"),
        ],
        quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "4"}},
    )
    refusal = budget_refusal(snap, "tenant-a-c", {"h100": 2})
    assert refusal is not None
    assert refusal.reason is Reason.BUDGET_EXCEEDED
    assert (
        refusal.message == "budget gpu.cozystack.io/h100 of tenant-a: 4 allowed, 3 in use, order of 2 exceeds it by 1"
    )
    assert budget_refusal(snap, "tenant-a-c", {"h100": 1}) is None


def test_an_order_must_fit_the_budget_of_every_ancestor() -> None:
    snap = snapshot(
        devices=[device("d1", namespace="tenant-x", count=3, phase=Phase.BOUND, node="n1")],
        quotas={"tenant-root": {"requests.gpu.cozystack.io/total": "4"}, "tenant-a": {"gpu.cozystack.io/h100": "8"}},
    )
    refusal = budget_refusal(snap, "tenant-a-b", {"h100": 2})
    assert refusal is not None
    assert refusal.subject == "tenant-root"
    assert refusal.key == "gpu.cozystack.io/total"


def test_the_total_budget_caps_every_class_together() -> None:
    snap = snapshot(
        classes=[gpu_class("h100"), gpu_class("a10", resource="nvidia.com/GA102GL_A10")],
        devices=[device("d1", cls="a10", count=2, phase=Phase.BOUND, node="n1")],
        quotas={"tenant-a": {"requests.gpu.cozystack.io/total": "3"}},
    )
    assert budget_refusal(snap, "tenant-a", {"h100": 1}) is None
    assert budget_refusal(snap, "tenant-a", {"h100": 2}) is not None


def test_a_lost_device_counts_against_budgets_and_an_unaccepted_order_does_not() -> None:
    snap = snapshot(
        devices=[device("lost", count=2, phase=Phase.LOST), device("pending", count=2, phase=Phase.PENDING)],
        quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "3"}},
    )
    assert snap.usage_of("tenant-a").per_class == {"h100": 2}
    assert budget_refusal(snap, "tenant-a", {"h100": 1}) is None
    assert budget_refusal(snap, "tenant-a", {"h100": 2}) is not None


def test_an_unreadable_budget_refuses_every_order_under_it() -> None:
    snap = snapshot(quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "plenty"}})
    refusal = budget_refusal(snap, "tenant-a-b", {"h100": 1})
    assert refusal is not None
    assert refusal.reason is Reason.BUDGET_UNREADABLE
    assert "gpu.cozystack.io/h100 of tenant-a" in refusal.message
    assert "'plenty'" in refusal.message


def test_a_raw_key_blocks_the_class_until_the_same_tenant_declares_a_gpu_key() -> None:
    blocked = snapshot(quotas={"tenant-a": {f"requests.{H100}": "4"}})
    refusal = budget_refusal(blocked, "tenant-a-b", {"h100": 1})
    assert refusal is not None
    assert refusal.reason is Reason.RAW_KEY_BLOCKED
    assert "class h100" in refusal.message
    # A GPU key declared by another tenant (the parent) does not lift the block.
    still = snapshot(
        quotas={"tenant-a": {f"requests.{H100}": "4"}, "tenant-root": {"requests.gpu.cozystack.io/total": "9"}}
    )
    assert budget_refusal(still, "tenant-a", {"h100": 1}) is not None
    lifted = snapshot(quotas={"tenant-a": {f"requests.{H100}": "4", "requests.gpu.cozystack.io/total": "9"}})
    assert budget_refusal(lifted, "tenant-a", {"h100": 1}) is None


def test_once_unblocked_a_raw_key_caps_devices_and_raw_name_pods_together() -> None:
    snap = snapshot(
        devices=[device("d1", count=1, phase=Phase.BOUND, node="n1")],
        pods=[pod("trainer", namespace="tenant-a-b", requests={H100: 2})],
        quotas={"tenant-a": {f"requests.{H100}": "4", "requests.gpu.cozystack.io/total": "10"}},
    )
    assert snap.usage_of("tenant-a").raw == {H100: 3}
    refusal = budget_refusal(snap, "tenant-a", {"h100": 2})
    assert refusal is not None
    assert refusal.key == f"requests.{H100}"
    assert refusal.message.endswith("4 allowed, 3 in use, order of 2 exceeds it by 1")


def test_pods_in_a_final_phase_count_under_no_raw_key() -> None:
    from cozygpu.model.snapshot import PodPhase

    snap = snapshot(pods=[pod("done", requests={H100: 2}, phase=PodPhase.SUCCEEDED)])
    assert snap.usage_of("tenant-a").raw == {}


def test_the_remaining_budget_is_the_tightest_limit_up_the_ancestry() -> None:
    snap = snapshot(
        devices=[device("d1", namespace="tenant-a", count=3, phase=Phase.BOUND, node="n1")],
        quotas={
            "tenant-a-b": {"requests.gpu.cozystack.io/h100": "5"},
            "tenant-a": {"requests.gpu.cozystack.io/total": "4"},
        },
    )
    view = class_budget(snap, "tenant-a-b", snap.classes["h100"])
    assert view.remaining == 1
    assert view.limiting is not None
    assert view.limiting.namespace == "tenant-a"
    assert class_budget(snap, "tenant-b", snap.classes["h100"]).remaining is None


def test_the_remaining_budget_is_never_negative_when_a_budget_was_lowered_below_its_usage() -> None:
    snap = snapshot(
        devices=[device("d1", count=5, phase=Phase.BOUND, node="n1")],
        quotas={"tenant-a": {"requests.gpu.cozystack.io/h100": "2"}},
    )
    assert class_budget(snap, "tenant-a", snap.classes["h100"]).remaining == 0


TENANTS = ["tenant-root", "tenant-a", "tenant-b", "tenant-a-x", "tenant-a-y", "tenant-b-z", "tenant-a-x-q"]


@st.composite
def budget_worlds(draw: st.DrawFn) -> tuple[dict[str, dict[str, object]], list[tuple[str, str, int]]]:
    quotas: dict[str, dict[str, object]] = {}
    for tenant in TENANTS:
        hard: dict[str, object] = {}
        for key in ("gpu.cozystack.io/h100", "gpu.cozystack.io/a10", "gpu.cozystack.io/total"):
            if draw(st.booleans()):
                hard[f"requests.{key}"] = str(draw(st.integers(min_value=0, max_value=8)))
        if hard:
            quotas[tenant] = hard
    orders = draw(
        st.lists(
            st.tuples(
                st.sampled_from(TENANTS), st.sampled_from(["h100", "a10"]), st.integers(min_value=1, max_value=4)
            ),
            max_size=25,
        )
    )
    return quotas, orders


@settings(max_examples=150, deadline=None)
@given(budget_worlds())
def test_no_accepted_order_exceeds_any_budget_up_the_ancestry(
    world: tuple[dict[str, dict[str, object]], list[tuple[str, str, int]]],
) -> None:
    quotas, orders = world
    snap = snapshot(classes=[gpu_class("h100"), gpu_class("a10", resource="nvidia.com/A10")], quotas=quotas)
    ledger = BudgetLedger(snap)
    for namespace, cls, count in orders:
        if ledger.refusal(namespace, {cls: count}) is None:
            ledger.accept(namespace, {cls: count})
    for tenant, declared in snap.budgets.items():
        used = ledger.extra.get(tenant)
        if used is None:
            continue
        for cls, value in declared.per_class.items():
            assert value.amount is not None
            assert used.per_class.get(cls, 0) <= value.amount
        if declared.total is not None:
            assert declared.total.amount is not None
            assert used.total <= declared.total.amount
        for cls in ("h100", "a10"):
            remaining = class_budget(snap, tenant, snap.classes[cls], extra=ledger.extra).remaining
            assert remaining is None or remaining >= 0
