"""Worked examples of the scheduler's pod arithmetic, from the Kubernetes documentation."""

from __future__ import annotations

from fractions import Fraction

import pytest

from cozygpu.model.pods import InitContainer, PodResources, container_requests, pod_requests, whole_requests

GPU = "nvidia.com/GH100_H100_SXM5_80GB"
Mi = 2**20


def req(**values: object) -> dict[str, Fraction]:
    return container_requests({k.replace("_", "/"): v for k, v in values.items()}, {})


def test_overhead_is_added_to_the_containers_sum_as_in_the_pod_overhead_example() -> None:
    # Pod Overhead docs: two containers (500m/100Mi and 1500m/100Mi, set as limits)
    # with a RuntimeClass overhead of 250m/120Mi: the scheduler looks for 2250m and 320Mi.
    resources = PodResources(
        containers=(
            container_requests({}, {"cpu": "500m", "memory": "100Mi"}),
            container_requests({}, {"cpu": "1500m", "memory": "100Mi"}),
        ),
        overhead=container_requests({"cpu": "250m", "memory": "120Mi"}, {}),
    )
    assert pod_requests(resources) == {"cpu": Fraction(9, 4), "memory": Fraction(320 * Mi)}


def test_the_largest_init_container_wins_when_it_exceeds_the_app_containers() -> None:
    # Init containers docs: the effective request is the higher of the sum of app
    # containers and the highest init container.
    resources = PodResources(
        containers=(req(cpu="1"), req(cpu="500m")),
        init_containers=(InitContainer(requests=req(cpu="2")), InitContainer(requests=req(cpu="1"))),
    )
    assert pod_requests(resources)["cpu"] == 2


def test_app_containers_win_when_their_sum_exceeds_every_init_container() -> None:
    resources = PodResources(
        containers=(req(cpu="1"), req(cpu="1500m")),
        init_containers=(InitContainer(requests=req(cpu="2")),),
    )
    assert pod_requests(resources)["cpu"] == Fraction(5, 2)


def test_sidecars_add_to_the_app_containers() -> None:
    resources = PodResources(
        containers=(req(nvidia_com="1"),),
        init_containers=(InitContainer(requests=req(nvidia_com="1"), sidecar=True),),
    )
    assert pod_requests(resources)["nvidia/com"] == 2


@pytest.mark.parametrize(
    ("sidecar_first", "expected"),
    [(True, 3), (False, 2)],
    ids=["sidecar-declared-before-the-init-container", "sidecar-declared-after-it"],
)
def test_an_init_container_also_counts_the_sidecars_declared_before_it(sidecar_first: bool, expected: int) -> None:
    sidecar = InitContainer(requests={GPU: Fraction(1)}, sidecar=True)
    init = InitContainer(requests={GPU: Fraction(2)})
    resources = PodResources(
        containers=({GPU: Fraction(1)},),
        init_containers=(sidecar, init) if sidecar_first else (init, sidecar),
    )
    assert pod_requests(resources)[GPU] == expected


def test_a_limit_without_a_request_is_requested_at_the_limit() -> None:
    assert container_requests({}, {GPU: "2"}) == {GPU: 2}
    assert container_requests({GPU: "1"}, {GPU: "1"}) == {GPU: 1}


def test_pod_level_requests_replace_cpu_and_memory_but_never_extended_resources() -> None:
    resources = PodResources(
        containers=({"cpu": Fraction(1), GPU: Fraction(1)},),
        pod_level={"cpu": Fraction(4), GPU: Fraction(5)},
    )
    assert pod_requests(resources) == {"cpu": 4, GPU: 1}


def test_whole_requests_keep_extended_resources_only_and_round_fractions_up() -> None:
    requests = {"cpu": Fraction(2), GPU: Fraction(2), "example.com/dongle": Fraction(1, 2)}
    assert whole_requests(requests) == {GPU: 2, "example.com/dongle": 1}
    assert whole_requests(requests, [GPU]) == {GPU: 2}
