"""Heartbeats of running trials, and failing the trials of a worker that died.

Heartbeats: Optuna's own heartbeat (RDBStorage heartbeat_interval/grace_period/
failed_trial_callback) is recorded only inside Study.optimize (5.1: `ask()` warns that heartbeats
are "supposed to be used with Study.optimize") and only for RDB storages; the study loop here is
ask/tell and the journal file is a first-class option, so every running trial records its
heartbeat as a trial attribute on any storage. Every worker, before each trial, fails every
RUNNING trial whose heartbeat is older than the grace period (its worker died) and re-enqueues
that configuration (Optuna's RetryFailedTrialCallback, in effect), so the budget is spent in full.
The study open_study returns is a WorkerStudy: each trial it asks beats from one daemon thread
until told, whichever code asked it (the study loop, the race), so with several workers a live
worker's trial is never taken for a dead one's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

_log = logging.getLogger(__name__)
HEARTBEAT_ATTR = "heartbeat"
STALE_ATTR = "failed_by_heartbeat"
HEARTBEAT_INTERVAL = 10.0
GRACE_PERIOD = 60.0


def last_beat(t: FrozenTrial) -> float:
    """When the trial's worker last said it was alive (its start, before any heartbeat)."""
    start = t.datetime_start.timestamp() if t.datetime_start else 0.0
    return float(t.user_attrs.get(HEARTBEAT_ATTR, start))


def fail_stale(study: optuna.Study, grace: float = GRACE_PERIOD) -> list[int]:
    """Fail RUNNING trials whose heartbeat stopped; re-enqueue their configurations."""
    now = time.time()
    failed: list[int] = []
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        beat = last_beat(t)
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


class WorkerStudy(optuna.Study):
    """A study whose every trial this process asks records its heartbeat until it is told, from
    one daemon thread: whatever code asks (the study loop, the race, a warm start), a live
    worker's trial is never failed as stale by the others, and a dead worker's trials stop
    beating together."""

    def __init__(self, *args: Any, heartbeat_interval: float = HEARTBEAT_INTERVAL, **kw: Any):
        super().__init__(*args, **kw)
        self._beating: set[int] = set()
        self._beat_lock = threading.Lock()
        self._beat_interval = heartbeat_interval
        self._beat_thread: threading.Thread | None = None

    def ask(self, fixed_distributions: dict[str, Any] | None = None) -> optuna.Trial:
        trial = super().ask(fixed_distributions)
        self._storage.set_trial_user_attr(trial._trial_id, HEARTBEAT_ATTR, time.time())
        with self._beat_lock:
            self._beating.add(trial._trial_id)
            if self._beat_thread is None:
                self._beat_thread = threading.Thread(
                    target=self._beat, name="infertune-worker-heartbeat", daemon=True
                )
                self._beat_thread.start()
        return trial

    def tell(
        self,
        trial: optuna.Trial | int,
        values: float | Sequence[float] | None = None,
        state: TrialState | None = None,
        skip_if_finished: bool = False,
    ) -> FrozenTrial:
        try:
            return super().tell(trial, values, state, skip_if_finished)
        finally:
            trial_id = (
                trial._trial_id
                if isinstance(trial, optuna.Trial)
                else self._storage.get_trial_id_from_study_id_trial_number(self._study_id, trial)
            )
            with self._beat_lock:
                self._beating.discard(trial_id)

    def _beat(self) -> None:
        while True:
            time.sleep(self._beat_interval)
            with self._beat_lock:
                ids = list(self._beating)
            for trial_id in ids:
                try:
                    self._storage.set_trial_user_attr(trial_id, HEARTBEAT_ATTR, time.time())
                except (RuntimeError, ValueError, KeyError):  # finished elsewhere (failed stale)
                    with self._beat_lock:
                        self._beating.discard(trial_id)
                except Exception as exc:  # a database hiccup: beat again next time
                    _log.warning("heartbeat of trial %s not recorded: %s", trial_id, exc)
