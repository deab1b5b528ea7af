from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cozygpu.model.coverage import attached_to, budget_covering, capacity_covering, uncovered
from cozygpu.model.launchers import is_launcher, launcher_index, launcher_vmi
from cozygpu.model.snapshot import Phase
from tests.model.factories import H100, device, pod, snapshot, vmi


def test_a_pod_is_a_launcher_only_when_its_vmi_lists_its_uid_as_active() -> None:
    listed = pod("virt-launcher-vm1", uid="u1")
    other = pod("looks-like-a-launcher", uid="u2")
    index = launcher_index([vmi("vm1", active=["u1"])])
    assert launcher_vmi(listed, index) == ("tenant-a", "vm1")
    assert launcher_vmi(other, index) is None


def test_a_vmi_in_another_namespace_cannot_claim_a_pod() -> None:
    index = launcher_index([vmi("vm1", namespace="tenant-b", active=["u1"])])
    assert launcher_vmi(pod("p", uid="u1"), index) is None
    assert not is_launcher(pod("p", uid="u1"), vmi("vm1", namespace="tenant-b", active=["u1"]))


def test_a_pod_naming_a_vmi_without_being_active_counts_as_raw_name_usage() -> None:
    snap = snapshot(
        devices=[device("d1", phase=Phase.BOUND, node="n1", vmi="vm1")],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("impostor", uid="impostor", requests={H100: 1})],
    )
    assert snap.usage_of("tenant-a").raw == {H100: 2}
    assert snap.capacity["n1"][H100].raw_in_use == 1


def test_a_bound_device_covers_its_launcher_pod_for_budgets_and_for_capacity() -> None:
    snap = snapshot(
        devices=[device("d1", phase=Phase.BOUND, node="n1", vmi="vm1")],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", requests={H100: 1})],
    )
    assert snap.usage_of("tenant-a").raw == {H100: 1}
    assert snap.capacity["n1"][H100].held == 1
    assert snap.capacity["n1"][H100].raw_in_use == 0


def test_a_lost_device_counts_for_budgets_but_not_for_capacity() -> None:
    snap = snapshot(
        devices=[device("d1", phase=Phase.LOST, vmi="vm1")],
        vmis=[vmi("vm1", active=["launcher"])],
        pods=[pod("virt-launcher-vm1", uid="launcher", requests={H100: 1})],
    )
    # Budgets: the Lost device counts itself and covers its running pod: one unit, not two.
    assert snap.usage_of("tenant-a").raw == {H100: 1}
    assert snap.usage_of("tenant-a").per_class == {"h100": 1}
    # Capacity: the device holds nothing, so the running pod's GPU is counted on its node.
    assert snap.capacity["n1"][H100].held == 0
    assert snap.capacity["n1"][H100].raw_in_use == 1


def test_a_migration_target_pod_on_another_node_uses_units_there() -> None:
    snap = snapshot(
        devices=[device("d1", phase=Phase.BOUND, node="n1", vmi="vm1")],
        vmis=[vmi("vm1", active=["source", "target"])],
        pods=[
            pod("source", uid="source", node_name="n1", requests={H100: 1}),
            pod("target", uid="target", node_name="n2", requests={H100: 1}),
        ],
    )
    assert snap.usage_of("tenant-a").raw == {H100: 1}
    assert snap.capacity["n2"][H100].raw_in_use == 1
    assert snap.capacity["n1"][H100].raw_in_use == 0


def test_an_attachment_to_an_earlier_vmi_of_the_same_name_covers_nothing() -> None:
    old = device("d1", phase=Phase.BOUND, node="n1", vmi="vm1", vmi_uid="old-uid")
    assert not attached_to(old, vmi("vm1", uid="new-uid"))
    assert attached_to(old, vmi("vm1", uid="old-uid"))
    assert attached_to(device("d2", vmi="vm1"), vmi("vm1", uid="new-uid"))


def test_uncovered_usage_never_goes_below_zero() -> None:
    assert uncovered({H100: 1}, {H100: 3}) == {}
    assert uncovered({H100: 3, "x/y": 1}, {H100: 1}) == {H100: 2, "x/y": 1}


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([Phase.PENDING, Phase.BOUND, Phase.LOST]),
            st.booleans(),
            st.integers(min_value=1, max_value=4),
        ),
        max_size=8,
    )
)
def test_on_the_pods_node_the_coverage_readers_differ_exactly_on_lost_devices(
    members: list[tuple[Phase, bool, int]],
) -> None:
    devices = [
        device(
            f"d{i}",
            phase=phase,
            node="n1" if phase is Phase.BOUND else None,
            vmi="vm1" if attached else None,
            count=count,
        )
        for i, (phase, attached, count) in enumerate(members)
    ]
    for_budgets = {d.key for d in budget_covering(devices)}
    for_capacity = {d.key for d in capacity_covering(devices, pod_node="n1")}
    lost_attached = {d.key for d in devices if d.phase is Phase.LOST and d.attachment is not None}
    assert for_capacity <= for_budgets
    assert for_budgets - for_capacity == lost_attached
