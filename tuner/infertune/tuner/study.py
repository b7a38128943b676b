"""The Optuna study: sampler, SLO constraints, storage that survives restarts, heartbeats, seeds.

Storage URLs: none / "memory" (in-process), "sqlite:///path.db", "postgresql://...", and
"journal:///path.log" (Optuna's journal file, safe for several processes on one file system).

Parallel workers (budget.parallelTrials, one process or pod each) share one study on one storage,
and the budget is counted there, like Optuna's MaxTrialsCallback: a worker starts a trial only
while finished trials plus the trials RUNNING anywhere stay under `maxTrials` (`wait_for_slot`),
and the time budget is the time the study's trials spanned in the storage (`measuring_seconds`),
so a replacement worker that joins late stops with the others. Before assembling a result every
worker waits for the trials still running elsewhere (`settle`): each then sees the same finished
study. The TPE sampler's constant liar treats other workers' running trials as bad outcomes, so
they are not proposed twice.

Heartbeats and failing a dead worker's trials: heartbeat.py.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from infertune.tuner.candidate import Candidate
from infertune.tuner.heartbeat import GRACE_PERIOD as GRACE_PERIOD
from infertune.tuner.heartbeat import HEARTBEAT_ATTR as HEARTBEAT_ATTR
from infertune.tuner.heartbeat import HEARTBEAT_INTERVAL as HEARTBEAT_INTERVAL
from infertune.tuner.heartbeat import STALE_ATTR as STALE_ATTR
from infertune.tuner.heartbeat import Heartbeat as Heartbeat
from infertune.tuner.heartbeat import WorkerStudy as WorkerStudy
from infertune.tuner.heartbeat import fail_stale as fail_stale
from infertune.tuner.heartbeat import last_beat
from infertune.tuner.space import Space

OUTCOME_ATTR = "outcome"  # ok | stopped | failed | pruned | infeasible-quality
SEED_ATTR = "seeded"
DUPLICATE_ATTR = "duplicate_of"  # answered from an earlier measurement of the same configuration
INFEASIBLE = 1e3  # constraint value of a failed trial (any value > 0 is infeasible)
# Multi-objective (NSGA-II): output tokens/s up, e2e p95 ms down, peak memory down.


SHARED_SCHEMES = ("postgresql", "mysql", "journal")


def shared_storage_problem(url: str | None, workers: int) -> str | None:
    """Why `url` cannot hold a study `workers` processes on different nodes share (None: it can).
    SQLite and memory live in one pod; a journal file needs a file system every worker mounts."""
    if workers <= 1:
        return None
    scheme = (url or "memory").split(":", 1)[0].split("+", 1)[0]
    if scheme in SHARED_SCHEMES:
        return None
    return (
        f"budget.parallelTrials={workers} runs {workers} workers that share one study, but the "
        f"storage {scheme!r} lives inside one worker: use postgresql://... (the chart's "
        "storage.type=postgresql or external)"
    )


def storage_for(url: str | None) -> optuna.storages.BaseStorage | None:
    """An Optuna storage for `url`; None means in-memory."""
    if not url or url in ("memory", "inmemory", "in-memory"):
        return None
    if url.startswith("journal://"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(url.removeprefix("journal://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("postgresql://"):
        # SQLAlchemy >= 2.1 maps a bare postgresql:// to psycopg 3; the `storage` extra (and the
        # image) install psycopg2, so say which driver to use.
        url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
    if url.startswith(("sqlite://", "postgresql+psycopg2://", "postgresql+psycopg://", "mysql://")):
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
    raise ValueError(
        f"--storage {url!r} is not supported; use memory, sqlite:///PATH, journal:///PATH "
        "or postgresql://USER:PASSWORD@HOST/DB"
    )


def make_sampler(
    name: str, space: Space, *, seed: int | None, multi_objective: bool, startup_trials: int
) -> optuna.samplers.BaseSampler:
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, startup_trials))
    if name == "tpe":  # multi-objective too (MOTPE) when the study has several directions
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=startup_trials,
            multivariate=True,
            group=len(space.engines) > 1,
            # Parallel workers: a trial RUNNING elsewhere counts as a bad outcome, so TPE does not
            # propose it again while it is measured (Optuna 5.1's default too; said here).
            constant_liar=True,
        )
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(grid_space(space), seed=seed)
    raise ValueError(
        f"sampler {name!r} is not supported; allowed values: tpe, nsga2, gp, random, grid"
    )


def param_name(knob: str, engine: str, space: Space) -> str:
    """Knob names are per engine when several engines compete (their value sets differ)."""
    return knob if len(space.engines) <= 1 or knob == "engine" else f"{knob}@{engine}"


def grid_space(space: Space) -> dict[str, list[Any]]:
    if len(space.engines) != 1:
        raise ValueError("the grid sampler needs exactly one engine in search.engines")
    (e,) = space.engines.values()
    return e.by_knob()


def suggest(trial: optuna.Trial, space: Space) -> Candidate:
    engines = sorted(space.engines)
    engine = engines[0] if len(engines) == 1 else str(trial.suggest_categorical("engine", engines))
    e = space.engines[engine]

    def pick(knob: str, values: list[Any]) -> Any:
        return trial.suggest_categorical(param_name(knob, engine, space), values)

    return Candidate(engine=engine, **{k: pick(k, v) for k, v in e.by_knob().items()})


def params_of(config: Candidate, space: Space) -> dict[str, Any]:
    """The Optuna params that make `suggest` return `config` (for enqueue_trial)."""
    out: dict[str, Any] = {}
    if len(space.engines) > 1:
        out["engine"] = config.engine
    for knob in space.engines[config.engine].by_knob():
        out[param_name(knob, config.engine, space)] = config[knob]
    return out


def candidate_of(params: dict[str, Any], space: Space) -> Candidate | None:
    """The configuration `params` name (the inverse of `params_of`); None while incomplete."""
    engines = sorted(space.engines)
    engine = engines[0] if len(engines) == 1 else params.get("engine")
    if engine not in space.engines:
        return None
    knobs = space.engines[str(engine)].by_knob()
    names = {k: param_name(k, str(engine), space) for k in knobs}
    if any(n not in params for n in names.values()):
        return None
    return Candidate(engine=str(engine), **{k: params[n] for k, n in names.items()})


def in_flight(study: optuna.Study, space: Space, older_than: int | None = None) -> set[Candidate]:
    """Configurations RUNNING now (in other workers, when called between trials); with
    `older_than`, only in trials asked before that trial number."""
    out = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        c = candidate_of(dict(t.params), space)
        if c is not None and (older_than is None or t.number < older_than):
            out.add(c)
    return out


def await_other_worker(
    study: optuna.Study,
    space: Space,
    config: Candidate,
    trial_number: int,
    stale_after: float = GRACE_PERIOD,
    *,
    poll: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """When another worker is measuring `config` now (the sampler proposed it to both), wait for
    its measurement instead of making a second one; True when it waited. Only an older trial is
    waited for, so two workers proposed the same configuration at once never wait for each
    other. A dead worker's trial goes stale meanwhile, and then this one measures it."""
    waited = False
    settling = 0.0  # an older trial whose parameters are still being written: a moment's wait
    while True:
        older = [
            candidate_of(dict(t.params), space)
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.number < trial_number
        ]
        if config in older:
            waited = True
            sleep(poll)
            fail_stale(study, stale_after)
        elif None in older and settling < 2.0:
            sleep(0.05)
            settling += 0.05
        else:
            return waited


def open_study(
    name: str,
    storage: str | None,
    sampler: optuna.samplers.BaseSampler,
    *,
    multi_objective: bool,
    minimise: bool = False,
) -> optuna.Study:
    """`minimise`: the single objective is a cost (search.minimises), not a rate."""
    single = StudyDirection.MINIMIZE if minimise else StudyDirection.MAXIMIZE
    directions: list[StudyDirection] = (
        [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE, StudyDirection.MINIMIZE]
        if multi_objective
        else [single]
    )
    created = optuna.create_study(
        study_name=name,
        storage=storage_for(storage),
        sampler=sampler,
        directions=directions,
        load_if_exists=True,
        # Trials stop early on a certain SLO miss (trial.py); a median pruner would also stop
        # trials whose partial goodput merely trails, including ones that meet every bound.
        pruner=optuna.pruners.NopPruner(),
    )
    return WorkerStudy(name, created._storage, sampler=sampler, pruner=created.pruner)


def counted(study: optuna.Study, grace: float = GRACE_PERIOD) -> list[FrozenTrial]:
    """Trials that spend the budget: finished measurements and the ones other workers are
    measuring now (RUNNING, heartbeat within the grace period), not repeats of a measured
    configuration nor trials failed because their worker died. Called between this worker's own
    trials, so a loop that stops at `maxTrials` counted ones (the study loop, the race) does not
    start a trial the other workers' running ones already hold the budget for."""
    now = time.time()
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if _spent(t) or (_running([t]) and now - last_beat(t) <= grace)
    ]


def _spent(t: FrozenTrial) -> bool:
    return not t.user_attrs.get(DUPLICATE_ATTR) and (
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and not t.user_attrs.get(STALE_ATTR))
    )


def _running(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    return [
        t for t in trials if t.state == TrialState.RUNNING and not t.user_attrs.get(DUPLICATE_ATTR)
    ]


def measuring_seconds(trials: list[FrozenTrial], now: dt.datetime | None = None) -> float:
    """Seconds during which at least one trial of the study was running (the union of the trials'
    start..end spans, a running one up to now): the study's time budget spent, counted from the
    storage, so parallel trials are not counted twice and an idle pause (a resumed study) not at
    all. Optuna stamps trials with the worker's naive local time."""
    now = now or dt.datetime.now()
    spans = sorted(
        (t.datetime_start, t.datetime_complete or now)
        for t in trials
        if t.datetime_start is not None and not t.user_attrs.get(DUPLICATE_ATTR)
    )
    total, end = 0.0, None
    for start, stop in spans:
        if end is not None and start < end:
            start = end
        if stop > start:
            total += (stop - start).total_seconds()
            end = stop if end is None else max(end, stop)
    return total


def wait_for_slot(
    study: optuna.Study,
    max_trials: int,
    max_seconds: float,
    stale_after: float = GRACE_PERIOD,
    *,
    poll: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """True when this worker may start a trial now; False when the budget is spent (trials or
    time, as the storage counts them). While every trial of the budget is either finished or
    RUNNING in another worker, wait: a dead worker's trial goes stale and frees its slot."""
    while True:
        fail_stale(study, stale_after)
        trials = study.get_trials(deepcopy=False)
        done = sum(1 for t in trials if _spent(t))
        if done >= max_trials or measuring_seconds(trials) >= max_seconds:
            return False
        if done + len(_running(trials)) < max_trials:
            return True
        sleep(poll)


def claim_slot(study: optuna.Study, trial: optuna.Trial, max_trials: int) -> bool:
    """After `ask()`: whether this trial is within the budget. Workers that passed
    `wait_for_slot` at the same moment may together hold more trials than it allows; the newest
    of them give way (`give_back`), so the study measures exactly `maxTrials`."""
    trials = study.get_trials(deepcopy=False)
    running = sorted(t.number for t in _running(trials))
    excess = sum(1 for t in trials if _spent(t)) + len(running) - max_trials
    return excess <= 0 or trial.number not in running[-excess:]


def give_back(study: optuna.Study, trial: optuna.Trial) -> None:
    """End a trial that was asked but not measured (over the budget): FAIL, marked like an
    answered repeat, so neither the budget, the report nor the sampler counts it."""
    trial.set_user_attr(DUPLICATE_ATTR, "over-budget")
    study.tell(trial, state=TrialState.FAIL)


def settle(
    study: optuna.Study,
    stale_after: float = GRACE_PERIOD,
    *,
    timeout: float = 3600.0,
    poll: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait until no trial runs anywhere (other workers finish theirs, dead ones go stale), so the
    result is assembled from the finished study. Returns how many were still running at first."""
    deadline = time.monotonic() + timeout
    first: int | None = None
    while True:
        fail_stale(study, stale_after)
        running = len(_running(study.get_trials(deepcopy=False)))
        first = running if first is None else first
        if running == 0 or time.monotonic() >= deadline:
            drop_unclaimed_retries(study)
            return first
        sleep(poll)


def drop_unclaimed_retries(study: optuna.Study) -> int:
    """A dead worker's configuration re-enqueued for a retry (fail_stale) that no worker took
    before the budget ran out: ended (FAIL, marked unused), so it is neither reported as a
    trial nor left waiting in the study."""
    dropped = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if "retry_of" in t.user_attrs:
            study._storage.set_trial_user_attr(t._trial_id, DUPLICATE_ATTR, "unused-retry")
            if study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL):
                dropped += 1
    return dropped
