"""`infertune bench`: load-test an OpenAI-compatible server with a TuningSpec's traffic and SLOs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlparse

from pydantic import ValidationError

from infertune.tuner.api import SLO, TrafficProfile, parse_duration
from infertune.tuner.api.errors import describe_errors
from infertune.tuner.api.load import SpecError, load_tuning_spec
from infertune.tuner.loadgen.arrivals import ARRIVALS
from infertune.tuner.loadgen.endpoint import API_PATHS
from infertune.tuner.loadgen.ramp import RampResult, RampSpec, find_max_rate
from infertune.tuner.loadgen.runner import Options, run_in_loop, run_load
from infertune.tuner.loadgen.stats import LoadResult
from infertune.tuner.loadgen.table import format_result

USAGE_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="infertune bench",
        description="Load-test an OpenAI-compatible server: TTFT/ITL/TPOT/e2e percentiles, "
        "throughput, goodput and SLO attainment.",
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--profile", type=Path, help="TuningSpec or InferenceService YAML (its traffic and slo)"
    )
    p.add_argument("--model", help="served model name (default: the first of GET /v1/models)")
    p.add_argument("--tokenizer", type=Path, help="directory with the model's tokenizer.json")
    p.add_argument("--api", choices=sorted(API_PATHS), default="completions")
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("--duration", help='measured time, e.g. "30s" or "2m"')
    bound.add_argument("--num-requests", type=int, help="measured requests")
    p.add_argument("--rate", type=float, help="open loop: requests/s")
    p.add_argument("--concurrency", type=int, help="closed loop: requests in flight")
    p.add_argument("--arrival", choices=ARRIVALS, help="arrival process for --rate")
    p.add_argument("--burstiness", type=float, help="gamma shape for --arrival gamma")
    p.add_argument("--prompt-tokens", type=int, help="fixed prompt length (tokens)")
    p.add_argument("--output-tokens", type=int, help="fixed output length (tokens)")
    p.add_argument("--replay", help="JSONL of {prompt_tokens, output_tokens} to replay")
    p.add_argument("--warmup", type=int, help="unmeasured requests sent first")
    p.add_argument(
        "--ramp", metavar="START:MAX[:FACTOR[:REFINE]]", help="goodput search over rates"
    )
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos")
    p.add_argument("--timeout", default="10m", help="per-request timeout (default 10m)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="env var holding the API key")
    p.add_argument("--json", dest="json_out", help="write the result as JSON here ('-': stdout)")
    p.add_argument("--records", action="store_true", help="include every request in the JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--kernel-timestamps",
        action="store_true",
        help=(
            "time tokens by when the kernel received them, not when this process read them "
            "(plain HTTP): for a busy host, where the generator's own lateness would count as "
            "server latency; the default matches peer tools such as vllm bench serve"
        ),
    )
    return p


def build_profile(args: argparse.Namespace) -> tuple[TrafficProfile, SLO | None, Path | None]:
    """The traffic and SLO from --profile, with command-line overrides applied and validated."""
    traffic: dict[str, Any] = {}
    slo: SLO | None = None
    tokenizer: Path | None = None
    if args.profile is not None:
        spec = load_tuning_spec(args.profile)
        traffic = spec.traffic.to_wire()
        slo = spec.slo
        tokenizer = _model_dir(spec.model.uri)
    overrides: dict[str, Any] = {
        "duration": args.duration,
        "numRequests": args.num_requests,
        "arrival": args.arrival,
        "burstiness": args.burstiness,
        "replayFile": args.replay,
        "warmupRequests": args.warmup,
    }
    if args.duration is not None:
        traffic.pop("numRequests", None)
    if args.num_requests is not None:
        traffic.pop("duration", None)
    if args.rate is not None or args.concurrency is not None:
        # An explicit load on the command line replaces the profile's, not adds to it.
        traffic.pop("rate", None)
        traffic.pop("concurrency", None)
        overrides |= {"rate": args.rate, "concurrency": args.concurrency}
    if args.prompt_tokens is not None:
        overrides["promptTokens"] = {"distribution": "fixed", "mean": args.prompt_tokens}
    if args.output_tokens is not None:
        overrides["outputTokens"] = {"distribution": "fixed", "mean": args.output_tokens}
    traffic |= {k: v for k, v in overrides.items() if v is not None}
    if args.ramp is not None and "rate" not in traffic:
        traffic["rate"] = 1.0  # replaced by each ramp step
    try:
        profile = TrafficProfile.model_validate(traffic)
    except ValidationError as exc:
        raise SpecError("traffic", describe_errors(exc, TrafficProfile)) from exc
    if profile.duration is None and profile.num_requests is None:
        raise SpecError("traffic", ["set --duration or --num-requests (or traffic.duration)"])
    return profile, slo, tokenizer


def _model_dir(uri: str) -> Path | None:
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return None
    path = Path(parsed.path)
    return path if (path / "tokenizer.json").is_file() else None


class ProgressBar:
    """One redrawn line on a terminal: requests done, elapsed time, live p50 TTFT."""

    def __init__(self, stream: TextIO, traffic: TrafficProfile) -> None:
        self.stream = stream
        self.traffic = traffic
        self.t0 = time.perf_counter()

    def __call__(self, snap: LoadResult) -> None:
        elapsed = time.perf_counter() - self.t0
        t = self.traffic
        if t.num_requests is not None:
            frac = min(1.0, (snap.completed + snap.failed) / t.num_requests)
        else:
            frac = min(1.0, elapsed / float(t.duration or 1))
        bar = "#" * int(frac * 30)
        ttft = f"{snap.ttft.p50:.1f} ms" if snap.ttft.p50 is not None else "-"
        self.stream.write(
            f"\r[{bar:<30}] {frac:4.0%} {snap.completed} ok {snap.failed} failed "
            f"{elapsed:6.1f}s  p50 TTFT {ttft}  "
        )
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def bench_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        traffic, slo, tokenizer = build_profile(args)
        ramp = RampSpec.parse(args.ramp) if args.ramp else None
        timeout = parse_duration(args.timeout)
    except (SpecError, ValueError) as exc:
        print(f"infertune bench: {exc}", file=sys.stderr)
        return USAGE_ERROR
    options = Options(
        api=args.api,
        ignore_eos=not args.no_ignore_eos,
        timeout=timeout,
        api_key=os.environ.get(args.api_key_env) or None,
        seed=args.seed,
        progress_interval=0.5,
        kernel_timestamps=args.kernel_timestamps,
    )
    tokenizer = args.tokenizer or tokenizer
    show = not args.quiet and sys.stderr.isatty()
    try:
        if ramp is not None:
            ramp_result = run_in_loop(
                find_max_rate(
                    args.url,
                    traffic,
                    slo,
                    ramp,
                    model=args.model,
                    tokenizer_dir=tokenizer,
                    options=options,
                    on_step=lambda r, ok, _res: print(
                        f"rate {r:g} req/s: {'pass' if ok else 'fail'}", file=sys.stderr
                    ),
                )
            )
            return _report_ramp(ramp_result, slo, args)
        bar = ProgressBar(sys.stderr, traffic) if show else None
        result = run_in_loop(
            run_load(
                args.url,
                traffic,
                slo,
                model=args.model,
                tokenizer_dir=tokenizer,
                options=options,
                on_progress=bar,
            )
        )
        if bar is not None:
            bar.close()
    except ValueError as exc:
        print(f"infertune bench: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("\ninfertune bench: interrupted", file=sys.stderr)
        return 130
    title = f"infertune bench {args.url} ({args.api})"
    _emit(result.to_dict(with_records=args.records), format_result(result, slo, title), args)
    return 0 if result.completed else 1


def _report_ramp(res: RampResult, slo: SLO | None, args: argparse.Namespace) -> int:
    lines = [f"goodput search against {args.url}"]
    for rate, ok, step in res.steps:
        lines.append(
            f"  {rate:10.2f} req/s  {'pass' if ok else 'FAIL'}  achieved "
            f"{step.saturation.achieved_rate:8.2f} req/s  goodput "
            f"{(step.goodput if step.goodput is not None else step.request_throughput):8.2f}"
        )
    if res.best is None:
        lines.append("no rate met the SLOs; the lowest step's result follows")
        best = res.steps[0][2]
    else:
        lines.append(f"highest rate meeting the SLOs: {res.best_rate:.2f} req/s")
        best = res.best
    text = "\n".join(lines) + "\n\n" + format_result(best, slo, "at that rate")
    _emit(res.to_dict(), text, args)
    return 0 if res.best is not None else 1


def _emit(data: dict[str, Any], text: str, args: argparse.Namespace) -> None:
    if args.json_out == "-":
        print(json.dumps(data, indent=2))
        return
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
