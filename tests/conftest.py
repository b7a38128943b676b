"""The suite's one rule about `slow`: a test is slow when it lives under tests/slow/, or when it is a
long cluster suite (marked both `cluster` and `slow`; those stay in tests/integration beside the
cluster fixtures). Everything under tests/slow/ is marked slow here, so `-m "not slow"` never runs it
even if a module forgets its mark; a test marked slow anywhere else without `cluster` fails
collection, so the marker and the folder cannot drift apart."""

from __future__ import annotations

from pathlib import Path

import pytest

SLOW_DIR = Path(__file__).resolve().parent / "slow"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stray = []
    for item in items:
        if item.path.resolve().is_relative_to(SLOW_DIR):
            item.add_marker(pytest.mark.slow)
        elif item.get_closest_marker("slow") and not item.get_closest_marker("cluster"):
            stray.append(item.nodeid)
    if stray:
        raise pytest.UsageError(
            "marked slow outside tests/slow/ (move them there, or mark them cluster too if they "
            "need the cluster fixtures): " + ", ".join(stray)
        )
