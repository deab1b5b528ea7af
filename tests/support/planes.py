"""Control planes for tests that need one of their own, and the rule for when none can start.

Under ``CI=true`` a missing control plane fails the test (CI must never pass by
skipping); elsewhere it skips with the command that builds the binaries.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from cozygpu.devcluster import binaries
from cozygpu.devcluster.plane import ControlPlane, ControlPlaneError

#: The ``fleet`` fixture: ``await fleet(*SimNode)`` -> the names, Ready; removed after the test.
Fleet = Callable[..., Coroutine[Any, Any, list[str]]]


def start_plane(minor: str = binaries.DEFAULT_MINOR, *, full: bool = False) -> ControlPlane:
    """A control plane of the caller's own (which stops it), built binaries required.

    ``full`` adds kube-controller-manager, kube-scheduler and kwok. Under
    ``CI=true`` a plane that cannot start fails the test; elsewhere it skips.
    """
    try:
        return ControlPlane.start(minor=minor, build=False, full=full)
    except ControlPlaneError as err:
        unavailable(str(err))
        raise


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the control plane is required under CI=true: {reason}", pytrace=False)
    pytest.skip(f"control plane unavailable ({reason}); build it with `python -m cozygpu.devcluster.binaries`")
