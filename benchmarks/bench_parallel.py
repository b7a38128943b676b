"""Parallel tuning workers (budget.parallelTrials): wall time and best-found for N = 1, 2, 4 workers
on the same trial budget, side by side in one run.

Real worker processes (one `python bench_parallel.py --worker ...` each, as the tuning Job's pods
run one `infertune tune --workers N` each) share one study on a real PostgreSQL server (Debian's,
started here: scripts/devcluster/services.Postgres) through the tuner's own study loop
(search.run_study: budget counted in the storage, TPE with the constant liar, heartbeats). The
engine is replaced by the recorded landscape (benchmarks/data/landscape_tiny_cpu.json): a trial
returns the recorded figures of its configuration after sleeping its recorded duration (wall_s)
times TIME_SCALE, so N workers overlap exactly as N engines on N nodes would.

Reported per N (median over SEEDS studies): wall time from the moment every worker is up (they
import and open the study first, then start together, as pods on their own nodes would; on this
shared 2-core machine N processes importing at once would otherwise measure the machine) to the
last one's exit, speed-up over N = 1, best-found (the true value of the best feasible configuration found,
over the grid's optimum), configurations measured (the budget, exactly) and measured twice, and
the study's span (first trial's start to last trial's end).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LANDSCAPE = HERE / "data" / "landscape_tiny_cpu.json"
WORKERS = (1, 2, 4)
BUDGET = 16  # 10% of the 160-point grid
SEEDS = 2
# A recorded 11 s trial sleeps 3.3 s: long against TPE's sampling (tens of milliseconds per trial,
# more while N workers share this 2-core machine), as real trials are.
TIME_SCALE = 0.3


def _spec(raw: dict[str, Any]) -> Any:
    from infertune.tuner.api import TuningSpec

    grid = raw["grid"]
    search = {
        "engines": ["builtin"],
        "quantizations": grid["quantization"],
        "maxNumSeqs": {"values": grid["max_num_seqs"]},
        "maxNumBatchedTokens": {"values": grid["max_num_batched_tokens"]},
        "kvBlockSizes": grid["kv_block_sizes"],
        "cudaGraph": [False],
    }
    budget = {"maxTrials": BUDGET, "parallelTrials": 1}
    return TuningSpec.model_validate({**raw["spec"], "search": search, "budget": budget})


def _true(point: dict[str, Any]) -> float:
    """A configuration's value: its recorded goodput when it met every SLO, else 0."""
    ok = point["status"] == "ok" and all(point["slo_met"].values())
    return float(point["figures"].get("goodputRps", 0.0)) if ok else 0.0


def worker(url: str, study_name: str, seed: int, gate: Path) -> None:
    """One tuning worker: the tuner's study loop, trials replayed from the recording. It imports
    everything, says it is ready, and starts when the gate opens: pods on their own nodes start
    side by side, so N workers' start-up costs what one costs; here they would share 2 cores."""
    import optuna

    from infertune.tuner.candidate import Candidate
    from infertune.tuner.hardware import Hardware
    from infertune.tuner.search import Evaluation, ReportFn, run_study
    from infertune.tuner.space import build_space
    from infertune.tuner.study import make_sampler, open_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    raw = json.loads(LANDSCAPE.read_text())
    spec = _spec(raw)
    points = {Candidate.from_dict(p["config"]): p for p in raw["points"].values()}
    space = build_space(spec, Hardware(kind="cpu", product="replay", count=2, memory_bytes=1 << 34))

    def evaluate(c: Candidate, report: ReportFn) -> Evaluation:
        p = points[c]
        time.sleep(float(p["wall_s"]) * TIME_SCALE)
        return Evaluation(c, p["status"], dict(p["figures"]), dict(p["margins_ms"]),
                          reason=p.get("reason"))  # fmt: skip

    sampler = make_sampler("tpe", space, seed=seed, multi_objective=False, startup_trials=5)
    study = open_study(study_name, url, sampler, multi_objective=False)
    (gate / f"ready-{seed}").touch()
    while not (gate / "go").exists():
        time.sleep(0.02)
    run_study(study, space, spec, evaluate, max_trials=BUDGET, max_seconds=3600)


def _one(url: str, n: int, seed: int, optimum: float, points: dict[Any, Any]) -> dict[str, float]:
    import optuna

    from infertune.tuner.candidate import Candidate
    from infertune.tuner.study import storage_for

    name = f"parallel-{n}-{seed}"
    optuna.create_study(study_name=name, storage=storage_for(url), direction="maximize")
    gate = Path(tempfile.mkdtemp(prefix="bench-parallel-"))
    argv = [sys.executable, __file__, "--worker", url, name, str(gate)]
    # Worker i seeds its sampler with seed * 10 + i: workers of one study must not draw the same
    # random startup points, as pods of one Job would not.
    procs = [subprocess.Popen([*argv, str(seed * 10 + i)]) for i in range(n)]
    deadline = time.monotonic() + 300
    while len(list(gate.glob("ready-*"))) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    (gate / "go").touch()
    codes = [p.wait(timeout=900) for p in procs]
    shutil.rmtree(gate, ignore_errors=True)
    wall = time.monotonic() - started
    if any(codes):
        raise RuntimeError(f"worker exit codes {codes} (N={n}, seed {seed})")
    trials = optuna.load_study(study_name=name, storage=storage_for(url)).get_trials()
    measured = [
        t for t in trials if t.state.name == "COMPLETE" and not t.user_attrs.get("duplicate_of")
    ]
    configs = [Candidate.from_dict(t.user_attrs["config"]) for t in measured]
    feasible = [
        t for t in measured
        if t.user_attrs.get("outcome") == "ok" and all(c <= 0 for c in t.user_attrs["constraints"])
    ]  # fmt: skip
    best = max(feasible, key=lambda t: t.values[0], default=None)
    true_best = _true(points[Candidate.from_dict(best.user_attrs["config"])]) if best else 0.0
    done = [t for t in trials if t.datetime_complete is not None]
    span = max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)
    return {
        "wall": wall,
        "span": span.total_seconds(),
        "best": true_best / optimum,
        "measured": len(measured),
        "twice": len(configs) - len(set(configs)),
        "running": sum(1 for t in trials if t.state.name == "RUNNING"),
    }


def run() -> list[dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "scripts" / "devcluster"))
    from services import Postgres

    from infertune.tuner.candidate import Candidate

    raw = json.loads(LANDSCAPE.read_text())
    points = {Candidate.from_dict(p["config"]): p for p in raw["points"].values()}
    optimum = max(_true(p) for p in points.values())
    serial_s = statistics.median(float(p["wall_s"]) for p in points.values()) * TIME_SCALE
    pg = Postgres().start()
    rows: list[dict[str, Any]] = []
    try:
        results = {
            n: [_one(pg.url, n, seed, optimum, points) for seed in range(SEEDS)] for n in WORKERS
        }
    finally:
        pg.stop()
    base = statistics.median(r["wall"] for r in results[1])
    for n, runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        note = (
            f"{BUDGET} trials (recorded durations x{TIME_SCALE}, median {serial_s:.2f} s), "
            f"{SEEDS} studies, real PostgreSQL; measured {sorted({r['measured'] for r in runs})}, "
            f"measured twice {sum(r['twice'] for r in runs)}, left running {sum(r['running'] for r in runs)}"
        )
        rows.append({"name": f"N={n} workers: wall time", "value": wall, "unit": "s", "note": note})
        span = statistics.median(r["span"] for r in runs)
        rows.append({"name": f"N={n} workers: study span", "value": span, "unit": "s",
                     "note": "first trial's start to last trial's end"})  # fmt: skip
        rows.append({"name": f"N={n} workers: speed-up vs N=1", "value": base / wall, "unit": "x",
                     "note": "same budget, side by side in this run"})  # fmt: skip
        bests = [r["best"] for r in runs]
        rows.append({"name": f"N={n} workers: best found / optimum", "value": statistics.median(bests),
                     "unit": "", "note": "per study: " + ", ".join(f"{b:.3f}" for b in bests)})  # fmt: skip
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3], int(sys.argv[5]), Path(sys.argv[4]))
    else:
        for row in run():
            print(f"{row['name']:<40} {row['value']:>8.3f} {row['unit']:<3} {row['note']}")
