"""The readable form of a LoadResult: one screen, milliseconds, the SLO verdict next to the numbers."""

from __future__ import annotations

from infertune.tuner.api import SLO
from infertune.tuner.loadgen.stats import LoadResult, Summary

_COLUMNS = ("mean", "p50", "p90", "p95", "p99", "max")


def _cell(value: float | None) -> str:
    return f"{value:9.2f}" if value is not None else f"{'-':>9}"


def _row(name: str, s: Summary) -> str:
    return f"  {name:<5}" + "".join(_cell(getattr(s, c)) for c in _COLUMNS) + f"{s.count:>9}"


def format_result(r: LoadResult, slo: SLO | None, title: str = "infertune bench") -> str:
    if r.mode == "open":
        load = f"open loop, {r.rate:g} req/s offered"
        if r.concurrency is not None:
            load += f", at most {r.concurrency} in flight"
    else:
        load = f"closed loop, {r.concurrency} in flight"
    lines = [
        title,
        f"  {load}; {r.duration_s:.2f} s measured" + ("; STOPPED EARLY" if r.stopped_early else ""),
        f"  requests: {r.sent} sent, {r.completed} ok, {r.failed} failed",
    ]
    for reason, count in sorted(r.errors.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {count} x {reason}")
    lines.append("")
    lines.append("  (ms) " + "".join(f"{c:>9}" for c in _COLUMNS) + f"{'samples':>9}")
    for name in ("ttft", "itl", "tpot", "e2e"):
        lines.append(_row(name.upper(), getattr(r, name)))
    lines.append("")
    lines.append(
        f"  throughput: {r.request_throughput:.2f} req/s, {r.output_throughput:.1f} output tok/s, "
        f"{r.input_throughput:.1f} input tok/s"
    )
    if slo is not None and r.goodput is not None:
        lines.append(f"  goodput:    {r.goodput:.2f} req/s meeting every SLO")
        for metric, obj in slo.bounds().items():
            summary: Summary = getattr(r, metric)
            value = summary.at(obj.percentile)
            shown = f"{value:.2f} ms" if value is not None else "no samples"
            verdict = "met" if r.slo_met.get(metric) else "MISSED"
            lines.append(
                f"    {metric} {obj.percentile} <= {obj.max}: {shown} -> {verdict}; "
                f"{r.slo_attainment.get(metric, 0.0):.1%} of requests within"
            )
    sat = r.saturation
    if sat.saturated:
        lines.append("  saturation: SATURATED - " + "; ".join(sat.reasons))
    elif r.mode == "open":
        lines.append(
            f"  saturation: none (achieved {sat.achieved_rate:.2f} req/s, "
            f"max {sat.max_in_flight} in flight)"
        )
    if sat.dispatch_lag_p99_ms is not None and sat.dispatch_lag_p99_ms > 5:
        lines.append(
            f"  warning: requests left {sat.dispatch_lag_p99_ms:.1f} ms late at p99; "
            "the generator itself is short of CPU"
        )
    if r.prompt_tokens_requested is not None:
        served = (
            f"{r.prompt_tokens_server:.1f}"
            if r.prompt_tokens_server is not None
            else "not reported"
        )
        how = "tokenizer-exact" if r.prompt_length_exact else "approximate: no --tokenizer"
        lines.append(
            f"  prompt tokens: {r.prompt_tokens_requested:.1f} requested, {served} by the "
            f"server's count ({how})"
        )
    return "\n".join(lines)
