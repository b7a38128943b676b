"""Canary decisions: promoted only when its own live figures held the SLOs for the window."""

from __future__ import annotations

import pytest

from infertune.operator.api import CanaryRun, InferenceServiceStatus, ServingConfig
from infertune.operator.canary import UNPROVEN_AFTER, judge, record

T0, T1 = "2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z"


@pytest.fixture
def run(config: ServingConfig) -> CanaryRun:
    return CanaryRun(config=config, started_at="2026-01-01T00:00:00Z")


def test_the_window_runs_from_the_first_traffic_and_clean_checks_promote(run: CanaryRun) -> None:
    run = record(record(run, True, [], T0), True, [], T1)
    assert run.proving_since == T0 and run.checks_met == 2
    # Long since started (pods loading), but only 100 s of traffic: keep watching.
    assert judge(run, 500, 100, 300, rollback_on_breach=True).verdict == "wait"
    done = judge(run, 700, 301, 300, rollback_on_breach=True)
    assert (done.verdict, done.reason) == ("promote", "CanaryPromoted")
    assert "2 check(s)" in done.message


def test_a_breach_rolls_back_at_once_or_at_the_end_of_the_window(run: CanaryRun) -> None:
    bad = record(record(run, True, [], T0), False, ["ttft p95 900.0ms > 500ms"], T1)
    now = judge(bad, 10, 10, 300, rollback_on_breach=True)
    assert (now.verdict, now.reason) == ("rollback", "SLOBreach")
    assert "ttft p95 900.0ms" in now.message
    # Without rollbackOnSLOBreach it still may not be promoted: it waits, then rolls back.
    assert judge(bad, 10, 10, 300, rollback_on_breach=False).verdict == "wait"
    assert judge(bad, 301, 301, 300, rollback_on_breach=False).verdict == "rollback"
    # A later clean check does not wash out the miss.
    later = record(bad, True, [], T1)
    assert judge(later, 301, 301, 300, rollback_on_breach=False).verdict == "rollback"


def test_a_canary_no_traffic_reaches_is_given_up_not_promoted(run: CanaryRun) -> None:
    idle = record(record(run, None, [], T0), None, [], T1)
    assert idle == run and idle.proving_since is None
    assert judge(idle, 301, None, 300, rollback_on_breach=True).verdict == "wait"
    out = judge(idle, UNPROVEN_AFTER * 300, None, 300, rollback_on_breach=True)
    assert (out.verdict, out.reason) == ("rollback", "Unproven")


def test_the_canary_lives_in_the_status_and_leaves_no_trace_when_cleared(run: CanaryRun) -> None:
    st = InferenceServiceStatus(canary=record(run, True, [], T0))
    wire = st.to_wire()
    assert wire["canary"]["config"]["quantization"] == "int8"
    assert wire["canary"]["checksMet"] == 1 and wire["canary"]["provingSince"] == T0
    cleared = InferenceServiceStatus.model_validate(wire).model_copy(update={"canary": None})
    assert "canary" not in cleared.to_wire()
