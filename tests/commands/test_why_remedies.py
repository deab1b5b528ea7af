"""What would change a refusal, decided again by the model on the snapshot with the change made."""

from __future__ import annotations

from cozygpu import keys
from cozygpu.commands import why
from cozygpu.model.snapshot import Phase
from tests.model.factories import device, gpu_nodes, snapshot

KEY = ("tenant-a-ml", "order")


def test_every_budget_up_the_ancestry_is_named_in_turn_until_the_order_fits() -> None:
    state = snapshot(
        devices=[device("held", namespace="tenant-a-ml", count=2, phase=Phase.BOUND, node="n1"),
                 device("order", namespace="tenant-a-ml", count=3)],
        quotas={"tenant-a": {keys.QUOTA_TOTAL: "4"}, "tenant-a-ml": {f"requests.{keys.class_quota_key('h100')}": "3"}},
    )
    text, refusal = why.decide_device(state, KEY)
    assert refusal is not None
    assert text.startswith("not accepted: budget")

    steps = why.remedies(state, refusal, lambda s: why.decide_device(s, KEY)[1], [state.devices[KEY]], None)

    assert steps == [
        # The model names the budget exceeded the most first; deciding again names the next one.
        f"raise budget {keys.class_quota_key('h100')} of tenant-a-ml from 3 to 5 (by 2)",
        f"raise budget {keys.QUOTA_TOTAL} of tenant-a from 4 to 5 (by 1)",
        "with that, the order would be accepted now",
    ]


def test_a_budget_raised_still_leaves_the_capacity_limit_behind_it_named() -> None:
    nodes, inventories = gpu_nodes(("n1", 2))
    state = snapshot(nodes=nodes, inventories=inventories,
                     devices=[device("order", namespace="tenant-a-ml", count=3)],
                     quotas={"tenant-a": {keys.QUOTA_TOTAL: "1"}})
    _, refusal = why.decide_device(state, KEY)
    assert refusal is not None

    steps = why.remedies(state, refusal, lambda s: why.decide_device(s, KEY)[1], [state.devices[KEY]], None)

    assert steps[0] == f"raise budget {keys.QUOTA_TOTAL} of tenant-a from 1 to 3 (by 2)"
    assert steps[1].startswith("then: ")
    assert steps[2] == "node n1: 2 of 2 nvidia.com/GH100_H100_SXM5_80GB free for this set, it needs 3; " \
        "1 more would have to be freed there"
