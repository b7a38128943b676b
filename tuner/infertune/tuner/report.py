"""The human report: Markdown and HTML with PNG plots (Pareto front, knob effects, history, importance)."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from infertune.tuner.result import TrialRecord, TuningResult


def _plots(result: TuningResult, out: Path, importance: dict[str, float]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [t for t in result.trials if t.figures]
    made: list[tuple[str, str]] = []
    if not measured:
        return made

    def color(t: TrialRecord) -> str:
        return (
            "tab:green" if t.feasible else ("tab:orange" if t.outcome == "stopped" else "tab:red")
        )

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(
        [t.figures.get("e2eP95Ms", math.nan) for t in measured],
        [t.figures.get("outputTokensPerSecond", 0.0) for t in measured],
        c=[color(t) for t in measured],
    )
    front = sorted(result.pareto, key=lambda t: t.figures.get("e2eP95Ms", 0.0))
    ax.plot(
        [t.figures.get("e2eP95Ms", math.nan) for t in front],
        [t.figures.get("outputTokensPerSecond", 0.0) for t in front],
        "k--",
        label="Pareto front",
    )
    ax.set_xlabel("e2e p95 (ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput vs latency (green: meets SLOs)")
    ax.legend()
    made.append(_save(fig, out / "pareto.png", "Pareto front"))

    # The knobs are whatever the configurations carry (their declared order): a knob added to the
    # declaration appears here without a change to the report.
    names = list(dict.fromkeys(k for t in measured for k in t.config))
    knobs = [k for k in names if len({str(t.config.get(k)) for t in measured}) > 1]
    if knobs:
        fig, axes = plt.subplots(1, len(knobs), figsize=(3.2 * len(knobs), 3.2), squeeze=False)
        for ax, knob in zip(axes[0], knobs, strict=True):
            values = sorted({str(t.config.get(knob)) for t in measured}, key=_natural)
            for i, v in enumerate(values):
                ys = [t.objective or 0.0 for t in measured if str(t.config.get(knob)) == v]
                ax.scatter([i] * len(ys), ys, c="tab:blue", alpha=0.6)
            ax.set_xticks(range(len(values)), values, rotation=45)
            ax.set_title(knob)
        axes[0][0].set_ylabel(result.objective)
        fig.tight_layout()
        made.append(_save(fig, out / "knobs.png", "Each knob's effect on the objective"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ordered = sorted(result.trials, key=lambda t: t.number)
    ys = [t.objective or 0.0 for t in ordered]
    pick = min if result.objective == "cost-per-token" else max  # the cost is minimised
    best: list[float] = []
    running: float | None = None
    for t in ordered:
        if t.feasible and t.objective is not None:
            running = t.objective if running is None else pick(running, t.objective)
        best.append(math.nan if running is None else running)
    ax.scatter([t.number for t in ordered], ys, c=[color(t) for t in ordered], label="trial")
    ax.step([t.number for t in ordered], best, where="post", label="best feasible")
    ax.set_xlabel("trial")
    ax.set_ylabel(result.objective)
    ax.legend()
    made.append(_save(fig, out / "history.png", "Optimisation history"))

    if importance:
        fig, ax = plt.subplots(figsize=(6, 3))
        names = list(importance)
        ax.barh(names, [importance[n] for n in names])
        ax.set_xlabel("importance (PED-ANOVA)")
        fig.tight_layout()
        made.append(_save(fig, out / "importance.png", "Parameter importance"))
    return made


def _natural(v: str) -> tuple[int, float | str]:
    try:
        return 0, float(v)
    except ValueError:
        return 1, v


def _save(fig: Any, path: Path, title: str) -> tuple[str, str]:
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name, title


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return "" if v is None else str(v)


def _cost_lines(result: TuningResult) -> list[str]:
    """What the winner's output tokens cost, per million, and under which assumptions."""
    basis = result.cost_basis()
    if basis is None or result.best is None:
        return []
    tps = result.best.figures.get("outputTokensPerSecond")
    if not basis.known:
        hours = basis.gpu_hours_per_million(tps)
        return [
            f"**Cost:** GPU price unknown (set spec.hardware.gpuHourlyPrice or the chart's "
            f"gpuHourlyPrices): {_fmt(hours)} GPU-hours per million output tokens "
            f"({basis.gpus} GPU).",
            "",
        ]
    lines = [f"**Cost:** ${_fmt(result.cost_per_million(result.best))} per million output tokens "
             f"({basis.unit}, at {_fmt(tps)} output tokens/s).", ""]  # fmt: skip
    return lines


def markdown(result: TuningResult, plots: list[tuple[str, str]]) -> str:
    lines = [f"# Tuning report: {result.study}", ""]
    lines += [f"**Status: {result.status}** — {result.reason}", ""]
    lines += [f"Hardware: {result.hardware.get('product')} ({result.hardware.get('kind')})", ""]
    if result.best is not None:
        b = result.best
        title = "Winner" if result.status == "succeeded" else "Closest configuration (SLOs not met)"
        lines += [f"## {title}", "", "| knob | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in b.config.items()]
        lines += ["", "| metric | measured | SLO margin (ms) |", "|---|---|---|"]
        for key, value in b.figures.items():
            metric = key[:4] if key.startswith("ttft") else key[:3]
            margin = b.margins_ms.get(metric) if key.endswith(("P95Ms", "P99Ms", "P50Ms")) else None
            lines.append(f"| {key} | {_fmt(value)} | {_fmt(margin)} |")
        lines.append("")
        lines += _cost_lines(result)
    if result.binding_constraint:
        lines += [f"**Binding constraint:** {result.binding_constraint}", ""]
    if result.profile_wire:
        p = result.profile_wire
        lines += ["## Profile", "", f"{p.get('hardware')}: {_fmt(p.get('memoryBandwidthGbps'))} GB/s, "
                  f"{_fmt(p.get('peakTflops'))} TFLOP/s peak", ""]  # fmt: skip
        lines += ["| precision | phase | bound | measured ms | floor ms | % of roofline |", "|---|---|---|---|---|---|"]  # fmt: skip
        for q, prof in (result.profile or {}).get("precisions", {}).items():
            for phase in ("prefill", "decode"):
                ph = prof[phase]
                lines.append(
                    f"| {q} | {phase} | {ph['bound']} | {_fmt(ph['measured_ms'])} | "
                    f"{_fmt(ph['floor_ms'])} | {_fmt(ph['percent_of_roofline'])} |"
                )
        lines.append("")
    pruned = (result.space or {}).get("pruned", [])
    if pruned:
        lines += ["## Pruned before any trial", ""]
        lines += [
            f"- {p['engine']} {p['knob']}={p['value']} ({p['rule']}): {p['reason']}" for p in pruned
        ]
        lines.append("")
    if result.quality:
        lines += ["## Quality guard", "", "| precision | top-1 agreement | KL | passed |", "|---|---|---|---|"]  # fmt: skip
        for q, r in result.quality.items():
            lines.append(
                f"| {q} | {r['top1_agreement']:.3f} | {r['kl_divergence']:.4f} | {r['passed']} |"
            )
        lines.append("")
    lines += ["## Trials", "", "| # | configuration | outcome | objective | ttft p95 | itl p95 | $/1M tokens | note |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    # The cost column covers every measured configuration, the engine's defaults included when
    # they were among the trials, so the winner's saving over them reads off the table.
    for t in sorted(result.trials, key=lambda t: t.number):
        cfg = " ".join(str(v) for v in t.config.values())
        lines.append(
            f"| {t.number}{'*' if t.seeded else ''} | {cfg} | {t.outcome} | {_fmt(t.objective)} | "
            f"{_fmt(t.figures.get('ttftP95Ms'))} | {_fmt(t.figures.get('itlP95Ms'))} | "
            f"{_fmt(result.cost_per_million(t))} | {(t.reason or '')[:80]} |"
        )
    lines += ["", "(* seeded from the roofline model)", ""]
    for name, title in plots:
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    return "\n".join(lines)


def write_report(result: TuningResult, out: Path, importance: dict[str, float]) -> Path:
    """Write report.md, report.html and the PNGs under `out`; return the HTML path."""
    out.mkdir(parents=True, exist_ok=True)
    plots = _plots(result, out, importance)
    md = markdown(result, plots)
    (out / "report.md").write_text(md)
    body = "".join(
        f"<p><img src='{html.escape(name)}' alt='{html.escape(t)}'></p>" for name, t in plots
    )
    page = (
        "<!doctype html><meta charset='utf-8'><title>infertune report</title>"
        f"<pre style='white-space:pre-wrap'>{html.escape(md)}</pre>{body}"
    )
    path = out / "report.html"
    path.write_text(page)
    return path
