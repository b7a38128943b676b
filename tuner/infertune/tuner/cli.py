"""`infertune tune SPEC`: the standalone tuner and the operator's tuning Job share this entry point.

Exit codes: 0 when the study ran (status succeeded or infeasible: the operator reads which from the
termination message), 1 when it failed (the Job retries and the study resumes from storage),
2 for an unusable spec or flag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

from infertune.tuner.api.load import SpecError, load_tuning_spec
from infertune.tuner.cost import parse_prices
from infertune.tuner.result import TuningResult, compact_summary, summary_json
from infertune.tuner.search import Evaluation

STORAGE_ENV = "INFERTUNE_STORAGE_URL"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="infertune tune",
        description="Profile a model, search serving configurations against the SLOs, report the winner.",
    )
    p.add_argument("spec", type=Path, help="TuningSpec or InferenceService YAML")
    p.add_argument("--study-name", help="Optuna study name (default: <file stem>-<spec hash>)")
    p.add_argument(
        "--storage",
        default=os.environ.get(STORAGE_ENV),
        help=f"memory, sqlite:///PATH, journal:///PATH or postgresql://... (default: ${STORAGE_ENV}, "
        "else sqlite under --out so a rerun resumes)",
    )
    p.add_argument(
        "--out", type=Path, default=Path("reports/tune"), help="result and report folder"
    )
    p.add_argument("--termination-message", type=Path, help="write the compact JSON summary here")
    p.add_argument("--max-trials", type=int, help="override budget.maxTrials")
    p.add_argument("--no-profile", action="store_true", help="skip ceilings, profile and seeding")
    p.add_argument("--no-quality", action="store_true", help="skip the quality guard")
    p.add_argument("--cpu", action="store_true", help="ignore GPUs (NVML)")
    p.add_argument(
        "--stale-after",
        type=float,
        default=60.0,
        help="seconds without a heartbeat after which another worker's RUNNING trial is failed",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="this process is one of N workers sharing the study (budget.parallelTrials; the "
        "operator's tuning Job passes it): the storage must reach every worker (PostgreSQL)",
    )
    p.add_argument(
        "--gpu-hourly-price",
        action="append",
        default=[],
        metavar="[PRODUCT=]USD",
        help="price per GPU-hour for slo.objective cost-per-token (per GPU product, or any)",
    )
    p.add_argument("--quiet", action="store_true", help="only the final summary")
    return p


def spec_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:8]


class Progress:
    """One line per trial: a bar, n/N, the configuration, what it measured, the best so far."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def __call__(
        self, done: int, total: int, ev: Evaluation, best: float | None, phase: str = ""
    ) -> None:
        if self.quiet:
            return
        width = 20
        filled = min(width, round(width * done / max(total, 1)))
        bar = "#" * filled + "-" * (width - filled)
        if ev.figures:
            what = (
                f"goodput {ev.figures.get('goodputRps', 0):.2f} req/s, ttft p95 "
                f"{ev.figures.get('ttftP95Ms', float('nan')):.0f}ms, itl p95 {ev.figures.get('itlP95Ms', float('nan')):.1f}ms"
            )
            if "capacityRps" in ev.figures:  # the ramp above the spec's rate (capacity.py)
                what += f", SLO capacity {ev.figures['capacityRps']:.2f} req/s"
        else:
            what = (ev.reason or "")[:90]
        best_s = "none feasible yet" if best is None else f"{best:.2f}"
        print(
            f"[{bar}] trial {done}/{total}{f' ({phase})' if phase else ''} {ev.config.label()}: "
            f"{ev.outcome} {what} | best {best_s}",
            flush=True,
        )


def _write_outputs(result: TuningResult, out: Path, termination: Path | None) -> Path | None:
    from infertune.tuner.report import write_report

    out.mkdir(parents=True, exist_ok=True)
    report: Path | None = None
    try:
        report = write_report(result, out, result.importance)
        result.report_path = str(report)
    except ImportError as exc:  # matplotlib is an optional extra
        print(
            f"infertune tune: no report plots ({exc}); install infertune[report]", file=sys.stderr
        )
    (out / "result.json").write_text(result.to_json())
    (out / "summary.json").write_text(json.dumps(compact_summary(result), indent=2))
    if termination is not None:
        termination.parent.mkdir(parents=True, exist_ok=True)
        termination.write_text(summary_json(result))
    return report


def _print_summary(result: TuningResult, report: Path | None) -> None:
    print(f"\nstatus: {result.status} — {result.reason}")
    if result.best is not None:
        label = "winner" if result.status == "succeeded" else "closest configuration"
        from infertune.tuner.candidate import Candidate

        print(f"{label}: {Candidate.from_dict(result.best.config).label()}")
        f = result.best.figures
        print(
            f"  goodput {f.get('goodputRps', 0):.2f} req/s, {f.get('outputTokensPerSecond', 0):.1f} "
            "output tokens/s"
        )
        if "capacityRps" in f:
            print(f"  SLO capacity {f['capacityRps']:.2f} req/s (every SLO percentile held)")
        for metric, margin in result.best.margins_ms.items():
            sign = "headroom" if margin is not None and margin >= 0 else "over"
            print(f"  {metric}: SLO margin {margin:+.1f} ms ({sign})")
    race = result.race or {}
    for key, name in (("over_runner_up", "runner-up"), ("over_default", "engine default")):
        r = race.get(key) or {}
        if r.get("ratio") is not None:
            interval = (
                f", {round(100 * r['level'])}% interval {r['low']:.2f}-{r['high']:.2f}"
                if r.get("low") is not None and r.get("high") is not None
                else ""
            )
            runs = r.get("n") or [0, 0]
            print(f"  {r['ratio']:.2f}x the {name} ({runs[0]} vs {runs[1]} runs{interval})")
    if result.warm_start:
        print(f"warm start: {result.warm_start.get('priorTrials', 0)} prior trials used")
    if result.binding_constraint:
        print(f"binding constraint: {result.binding_constraint}")
    if report is not None:
        print(f"report: {report}")


def _fail(termination: Path | None, study: str, message: str, code: int) -> int:
    print(f"infertune tune: {message}", file=sys.stderr)
    if termination is not None:
        payload = {"version": 1, "status": "failed", "reason": message[:1000], "study": study}
        termination.parent.mkdir(parents=True, exist_ok=True)
        termination.write_text(json.dumps(payload, separators=(",", ":")))
    return code


def _exit_on_sigterm() -> None:
    """SIGTERM (the Job deleted, a supervisor stopping us) unwinds like an exception, so the
    trial runner's `finally` stops the engine it started instead of leaving it orphaned."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def tune_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    _exit_on_sigterm()
    if args.max_trials is not None and args.max_trials < 1:
        return _fail(args.termination_message, "", "--max-trials must be at least 1", 2)
    try:
        spec = load_tuning_spec(args.spec)
    except SpecError as exc:
        return _fail(args.termination_message, "", "invalid spec: " + "; ".join(exc.problems), 2)
    try:
        prices = parse_prices(args.gpu_hourly_price)
    except ValueError as exc:
        return _fail(args.termination_message, "", str(exc), 2)
    study = args.study_name or f"{args.spec.stem}-{spec_hash(args.spec)}"
    storage = args.storage or f"sqlite:///{(args.out / 'study.db').resolve()}"
    from infertune.tuner.study import shared_storage_problem

    unshared = shared_storage_problem(storage, args.workers)
    if unshared is not None:
        return _fail(args.termination_message, study, unshared, 2)
    import warnings

    import optuna

    from infertune.tuner.tune import TuneOptions, run_tuning

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    opts = TuneOptions(
        study_name=study,
        out=args.out,
        storage=storage,
        max_trials=args.max_trials,
        profile=not args.no_profile,
        quality=not args.no_quality,
        use_gpu=not args.cpu,
        stale_after=args.stale_after,
        gpu_hourly_prices=prices,
        progress=Progress(args.quiet),
        log=(lambda _msg: None) if args.quiet else (lambda msg: print(msg, flush=True)),
    )
    if args.no_quality:
        spec.quality.enabled = False
    try:
        result = run_tuning(spec, opts)
    except (ValueError, OSError, RuntimeError) as exc:
        return _fail(args.termination_message, study, str(exc), 1)
    report = _write_outputs(result, args.out, args.termination_message)
    _print_summary(result, report)
    return 1 if result.status == "failed" else 0


if __name__ == "__main__":
    sys.exit(tune_main(sys.argv[1:]))
