"""The check that two leaders' decisions never interleave in the API server's order (the race and chaos tests')."""

from __future__ import annotations

import attrs

from tests.runtime.processes import Line, interleaved_decisions


@attrs.define
class Replica:
    identity: str
    lines: list[Line]


def written(*versions: int) -> list[Line]:
    return [{"msg": "device written", "resource_version": str(v)} for v in versions]


def test_terms_one_after_another_pass_and_a_deposed_leaders_late_write_is_named() -> None:
    first = Replica("r0", [*written(10, 12), {"msg": "leader-work-started"}])
    second = Replica("r1", written(15, 20))
    assert interleaved_decisions([first, second]) == []
    # The server's order is the resourceVersion's, not the logs': r0's 16 was taken after r1's 15.
    assert interleaved_decisions([Replica("r0", written(10, 16)), Replica("r1", written(15, 20))]) != []
    late = Replica("r0", written(10, 12, 21))
    [breach] = interleaved_decisions([late, second])
    assert "r0 (process 0) wrote a decision at resourceVersion 21" in breach
    assert "r1 (process 1)'s at 20" in breach


def test_a_restarted_replica_is_another_process() -> None:
    assert interleaved_decisions([Replica("a", written(1)), Replica("b", written(2)), Replica("a", written(3))]) == []
