"""The Optuna study: sampler, SLO constraints, storage that survives restarts, heartbeats, seeds.

Storage URLs: none / "memory" (in-process), "sqlite:///path.db", "postgresql://...", and
"journal:///path.log" (Optuna's journal file, safe for several processes on one file system).
Several workers on one storage share the study; the trial budget is counted in the storage, so
together they run `maxTrials` trials.

Heartbeats: Optuna's own heartbeat exists only for RDB storages, and the journal file is a
first-class option here, so every running trial records its heartbeat as a trial attribute on any
storage. A worker that starts fails every RUNNING trial whose heartbeat is older than the grace
period (its worker died) and re-enqueues that configuration, so the budget is still spent in full.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from infertune.tuner.candidate import Candidate
from infertune.tuner.space import Space

HEARTBEAT_ATTR = "heartbeat"
OUTCOME_ATTR = "outcome"  # ok | stopped | failed | pruned | infeasible-quality
STALE_ATTR = "failed_by_heartbeat"
SEED_ATTR = "seeded"
DUPLICATE_ATTR = "duplicate_of"  # answered from an earlier measurement of the same configuration
HEARTBEAT_INTERVAL = 10.0
GRACE_PERIOD = 60.0
INFEASIBLE = 1e3  # constraint value of a failed trial (any value > 0 is infeasible)
# Multi-objective (NSGA-II): output tokens/s up, e2e p95 ms down, peak memory down.


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
    return optuna.create_study(
        study_name=name,
        storage=storage_for(storage),
        sampler=sampler,
        directions=directions,
        load_if_exists=True,
        # Trials stop early on a certain SLO miss (trial.py); a median pruner would also stop
        # trials whose partial goodput merely trails, including ones that meet every bound.
        pruner=optuna.pruners.NopPruner(),
    )


def counted(study: optuna.Study) -> list[FrozenTrial]:
    """Trials that spend the budget: finished measurements, not repeats of a measured
    configuration nor trials failed because their worker died."""
    return [
        t
        for t in study.get_trials(deepcopy=False)
        if not t.user_attrs.get(DUPLICATE_ATTR)
        and (
            t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            or (t.state == TrialState.FAIL and not t.user_attrs.get(STALE_ATTR))
        )
    ]


def fail_stale(study: optuna.Study, grace: float = GRACE_PERIOD) -> list[int]:
    """Fail RUNNING trials whose heartbeat stopped; re-enqueue their configurations."""
    now = time.time()
    failed: list[int] = []
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        beat = float(
            t.user_attrs.get(
                HEARTBEAT_ATTR, t.datetime_start.timestamp() if t.datetime_start else 0
            )
        )
        if now - beat <= grace:
            continue
        storage.set_trial_user_attr(t._trial_id, STALE_ATTR, True)
        storage.set_trial_user_attr(
            t._trial_id,
            "failure_reason",
            f"worker stopped sending heartbeats for {now - beat:.0f}s",
        )
        if storage.set_trial_state_values(t._trial_id, TrialState.FAIL):
            failed.append(t.number)
            if t.params:  # the configuration it was measuring is measured again
                study.enqueue_trial(
                    t.params, user_attrs={"retry_of": t.number}, skip_if_exists=False
                )
    return failed


class Heartbeat:
    """Records `time.time()` on a running trial every `interval` seconds, from a thread."""

    def __init__(
        self, study: optuna.Study, trial: optuna.Trial, interval: float = HEARTBEAT_INTERVAL
    ) -> None:
        self.study = study
        self.trial_id = trial._trial_id
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infertune-heartbeat", daemon=True)

    def _run(self) -> None:
        storage = self.study._storage
        while True:
            try:
                storage.set_trial_user_attr(self.trial_id, HEARTBEAT_ATTR, time.time())
            except (RuntimeError, ValueError):  # the trial already finished
                return
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
