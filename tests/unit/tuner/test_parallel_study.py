"""Several workers on one study (budget.parallelTrials): the budget counted in the storage, other
workers' running trials waited for, a dead worker's trial failed by heartbeat, one finished study
seen by all. Real worker processes on a real storage (SQLite here; PostgreSQL in the cluster test
and in benchmarks/bench_parallel.py)."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from study_helpers import builtin_search, tpe_study

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import Hardware
from infertune.tuner.search import Evaluation, ReportFn, run_study
from infertune.tuner.space import Space, build_space
from infertune.tuner.study import (
    HEARTBEAT_ATTR,
    STALE_ATTR,
    WorkerStudy,
    await_other_worker,
    candidate_of,
    claim_slot,
    counted,
    fail_stale,
    give_back,
    in_flight,
    measuring_seconds,
    params_of,
    settle,
    shared_storage_problem,
    storage_for,
    suggest,
    wait_for_slot,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPEC = {
    "model": {"uri": "builtin://tiny"},
    "slo": {"ttft": {"max": "500ms"}, "itl": {"max": "50ms"}},
    "traffic": {"rate": 4, "numRequests": 20},
    "search": builtin_search([1, 2, 4, 8, 16], [128, 256, 512], seed=3),
    "budget": {"maxTrials": 9, "parallelTrials": 3},
}


def landscape(c: Candidate, report: ReportFn) -> Evaluation:
    time.sleep(0.3)  # long enough that the workers' trials overlap
    goodput = c.max_num_seqs * (2.0 if c.quantization == "int8" else 1.0)
    figures = {"goodputRps": goodput, "ttftP95Ms": 200.0, "itlP95Ms": 20.0}
    return Evaluation(c, "ok", figures, {"ttft": 300.0, "itl": 30.0})


def _space() -> Space:
    return build_space(
        TuningSpec.model_validate(SPEC),
        Hardware(kind="cpu", product="Test CPU", count=2, memory_bytes=8 << 30),
    )


def _study(url: str, name: str = "par", seed: int = 1) -> optuna.Study:
    return tpe_study(_space(), url, name, seed=seed)


def _worker(url: str, index: int) -> None:
    spec = TuningSpec.model_validate(SPEC)
    run_study(_study(url, seed=index), _space(), spec, landscape, max_trials=9, max_seconds=600)


def test_three_worker_processes_spend_the_budget_once_and_each_ends_on_the_finished_study(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/study.db"
    _study(url)  # created once, before the workers race to create it
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(url, i)) for i in range(3)]
    started = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    wall = time.monotonic() - started
    assert [p.exitcode for p in procs] == [0, 0, 0]
    trials = _study(url).get_trials()
    measured = [
        t for t in trials if t.state == TrialState.COMPLETE and not t.user_attrs.get("duplicate_of")
    ]
    # The budget, counted in the storage: 9 measurements in all, not 9 per worker.
    assert len(measured) == 9, [(t.number, t.state) for t in trials]
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    # They ran side by side: well under 9 x 0.3 s of trials one after another (plus start-up).
    spans = [(t.datetime_start, t.datetime_complete) for t in measured]
    overlapping = sum(
        1 for i, a in enumerate(spans) for b in spans[i + 1 :] if a[0] < b[1] and b[0] < a[1]
    )
    assert overlapping >= 3, (spans, wall)
    # No configuration measured twice: each worker sees the others' trials (constant liar for
    # running ones, the storage for finished ones).
    configs = [tuple(sorted(t.params.items())) for t in measured]
    assert len(set(configs)) == len(configs)


def test_wait_for_slot_waits_then_a_stale_trial_frees_its_slot(tmp_path: Path) -> None:
    s = _study(f"sqlite:///{tmp_path}/study.db")
    for _ in range(2):
        t = s.ask()
        s.tell(t, 1.0)
    dead = s.ask()
    dead.set_user_attr(HEARTBEAT_ATTR, time.time() - 30)
    waited: list[float] = []

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        if len(waited) > 5:
            raise AssertionError("never freed")

    # Grace 60 s: the dead trial is not stale yet, so the budget of 3 is taken; with grace 10 s
    # it goes stale at the next check, and its slot (not counted: failed by heartbeat) is free.
    with pytest.raises(AssertionError, match="never freed"):
        wait_for_slot(s, 3, 600, stale_after=60, sleep=sleep)
    assert wait_for_slot(s, 3, 600, stale_after=10, sleep=sleep)
    failed = s.get_trials(states=(TrialState.FAIL,))
    assert [t.user_attrs.get(STALE_ATTR) for t in failed] == [True]
    assert len(counted(s)) == 2


def test_the_budget_spent_is_false_and_settle_waits_for_running_trials(tmp_path: Path) -> None:
    s = _study(f"sqlite:///{tmp_path}/study.db")
    for _ in range(3):
        t = s.ask()
        s.tell(t, 1.0)
    assert not wait_for_slot(s, 3, 600)
    other = s.ask()  # another worker's last trial
    other.set_user_attr(HEARTBEAT_ATTR, time.time())
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        s.tell(other, 2.0)  # it finishes while we wait

    assert settle(s, 60, sleep=sleep) == 1
    assert len(polls) == 1 and not s.get_trials(states=(TrialState.RUNNING,))


def test_measuring_seconds_is_the_union_of_trial_spans() -> None:
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0)

    def trial(start: float, end: float | None) -> Any:
        return SimpleNamespace(
            datetime_start=t0 + dt.timedelta(seconds=start),
            datetime_complete=None if end is None else t0 + dt.timedelta(seconds=end),
            user_attrs={},
        )

    # 0-10 and 5-20 overlap (20 s), a pause, 100-110 (10 s), one running since 200 (now 230).
    trials = [trial(0, 10), trial(5, 20), trial(100, 110), trial(200, None)]
    assert measuring_seconds(trials, now=t0 + dt.timedelta(seconds=230)) == 60.0


def test_time_budget_counted_in_the_storage_stops_a_late_worker(tmp_path: Path) -> None:
    s = _study(f"sqlite:///{tmp_path}/study.db")
    t = s.ask()
    s.tell(t, 1.0)
    assert wait_for_slot(s, 10, 3600)
    assert not wait_for_slot(s, 10, 0.000001)  # the finished trial already spent it


def test_shared_storage_is_required_for_several_workers() -> None:
    assert shared_storage_problem("sqlite:////tmp/x.db", 1) is None
    assert shared_storage_problem("postgresql://u@h/db", 4) is None
    assert shared_storage_problem("postgresql+psycopg2://u@h/db", 4) is None
    why = shared_storage_problem("sqlite:////out/study.db", 2)
    assert why is not None and "parallelTrials=2" in why and "sqlite" in why
    assert "postgresql" in why
    assert shared_storage_problem(None, 2) is not None  # in-memory


def test_in_flight_and_candidate_of_invert_params_of(tmp_path: Path) -> None:
    space = _space()
    s = _study(f"sqlite:///{tmp_path}/study.db")
    config = Candidate(engine="builtin", quantization="int8", max_num_seqs=4,
                       max_num_batched_tokens=256, kv_block_size=16, cuda_graph=False)  # fmt: skip
    assert candidate_of(params_of(config, space), space) == config
    assert candidate_of({}, space) is None
    s.enqueue_trial(params_of(config, space))
    t = s.ask()
    assert suggest(t, space) == config
    assert in_flight(s, space) == {config}


def test_every_asked_trial_beats_until_told_whoever_asks_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/study.db"
    _study(url)
    s = WorkerStudy("par", storage_for(url), heartbeat_interval=0.05)
    t = s.ask()  # asked as the race does: no Heartbeat context around it
    first = s.get_trials()[0].user_attrs[HEARTBEAT_ATTR]
    time.sleep(0.4)
    later = s.get_trials()[0].user_attrs[HEARTBEAT_ATTR]
    assert later > first
    # Another worker checking for dead ones with a short grace finds it alive.
    assert fail_stale(_study(url), grace=0.3) == []
    s.tell(t, 1.0)
    done = s.get_trials()[0].user_attrs[HEARTBEAT_ATTR]
    time.sleep(0.3)
    assert s.get_trials()[0].user_attrs[HEARTBEAT_ATTR] == done  # stopped with the trial


def test_workers_that_took_the_last_slot_at_once_give_way_newest_first(tmp_path: Path) -> None:
    s = _study(f"sqlite:///{tmp_path}/study.db")
    for _ in range(2):
        t = s.ask()
        s.tell(t, 1.0)
    a, b = s.ask(), s.ask()  # both passed wait_for_slot with a budget of 3
    assert claim_slot(s, a, 3) and not claim_slot(s, b, 3)
    give_back(s, b)
    assert claim_slot(s, a, 3)
    assert len(counted(s)) == 3  # 2 done + a running; the given-back trial counts nowhere
    s.tell(a, 2.0)
    assert len(counted(s)) == 3 and not wait_for_slot(s, 3, 600)


def test_a_configuration_another_worker_measures_is_awaited_not_measured_twice(
    tmp_path: Path,
) -> None:
    space = _space()
    s = _study(f"sqlite:///{tmp_path}/study.db")
    config = Candidate(engine="builtin", quantization="int8", max_num_seqs=4,
                       max_num_batched_tokens=256, kv_block_size=16, cuda_graph=False)  # fmt: skip
    s.enqueue_trial(params_of(config, space))
    s.enqueue_trial(params_of(config, space))
    older, newer = s.ask(), s.ask()
    assert suggest(older, space) == suggest(newer, space) == config
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        s.tell(older, 3.0)  # the older one's measurement arrives

    assert await_other_worker(s, space, config, newer.number, sleep=sleep)
    assert len(polls) == 1
    # The older trial never waits for the newer one (no deadlock when both were proposed it).
    s2 = _study(f"sqlite:///{tmp_path}/study.db", name="other")
    s2.enqueue_trial(params_of(config, space))
    s2.enqueue_trial(params_of(config, space))
    first, second = s2.ask(), s2.ask()
    suggest(first, space), suggest(second, space)
    assert not await_other_worker(s2, space, config, first.number, sleep=sleep)


def test_a_retry_nobody_took_before_the_budget_ran_out_is_not_left_waiting(tmp_path: Path) -> None:
    s = _study(f"sqlite:///{tmp_path}/study.db")
    space = _space()
    for _ in range(2):
        t = s.ask()
        s.tell(t, 1.0)
    dead = s.ask()
    suggest(dead, space)
    dead.set_user_attr(HEARTBEAT_ATTR, time.time() - 3600)
    assert not wait_for_slot(s, 2, 600)  # fails the dead trial, re-enqueues it: budget spent
    assert [t.user_attrs.get("retry_of") for t in s.get_trials(states=(TrialState.WAITING,))] == [dead.number]  # fmt: skip
    settle(s)
    assert not s.get_trials(states=(TrialState.WAITING,))
    assert len(counted(s)) == 2
