"""Fixtures of the cache's unit tests: a hand-driven clock, an in-memory API server, a private registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tests.cache.fakes import FakeApi, FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()
