"""The metrics server's flags: HTTPS on an address of its own, its certificate from files or made at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from cozygpu.runtime.flags import Address, FlagError, parse

BASE = ["--namespace", "cozy-gpu"]


def test_the_metrics_address_cannot_be_the_probes_address() -> None:
    with pytest.raises(FlagError, match=r"--metrics-addr=127.0.0.1:8081: must differ from --health-addr"):
        parse([*BASE, "--health-addr", "127.0.0.1:8081", "--metrics-addr", "127.0.0.1:8081"], env={})
    with pytest.raises(FlagError, match="must differ from --health-addr"):
        parse([*BASE, "--metrics-addr", ":8081"], env={})


def test_port_zero_for_both_takes_a_free_port_for_each() -> None:
    options = parse([*BASE, "--health-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"], env={})
    assert options.health_addr == options.metrics_addr == Address("127.0.0.1", 0)


def test_the_metrics_certificate_comes_from_a_directory_when_one_is_given() -> None:
    assert parse(BASE, env={}).metrics_cert_dir is None
    assert parse([*BASE, "--metrics-cert-dir", "/tls"], env={}).metrics_cert_dir == Path("/tls")


def test_a_flag_given_twice_takes_its_last_value() -> None:
    """What the local plane's supervisor relies on when it appends the replicas' metrics flags."""
    options = parse([*BASE, "--health-addr", "127.0.0.1:7000", "--metrics-addr", "127.0.0.1:7000",
                     "--metrics-addr", "127.0.0.1:7001", "--metrics-cert-dir", "/a", "--metrics-cert-dir", "/b"],
                    env={})
    assert options.metrics_addr == Address("127.0.0.1", 7001)
    assert options.metrics_cert_dir == Path("/b")
