"""The report's plots (PNG files under the report folder; report.py inlines them in the HTML).

Every legend entry names something drawn: the three kinds of point are three scatters, and the
Pareto front is computed from the points on the plot (throughput up, end-to-end p95 down) and drawn
as the line through them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infertune.tuner.report_labels import figure_label, knob_label
from infertune.tuner.result import TrialRecord, TuningResult


def _meets(t: TrialRecord) -> bool:
    return t.feasible


def _stopped(t: TrialRecord) -> bool:
    return not t.feasible and t.outcome == "stopped"


def _misses(t: TrialRecord) -> bool:
    return not t.feasible and t.outcome != "stopped"


_KINDS: tuple[tuple[str, str, Callable[[TrialRecord], bool]], ...] = (
    ("meets the SLOs", "tab:green", _meets),
    ("stopped: an SLO certainly missed", "tab:orange", _stopped),
    ("misses an SLO or failed", "tab:red", _misses),
)


def _objective_label(objective: str) -> str:
    return {
        "goodput": "SLO capacity / goodput (req/s)",
        "throughput": "output throughput (tokens/s)",
        "cost-per-token": "cost per million output tokens",
    }.get(objective, objective)


def config_label(config: dict[str, Any]) -> str:
    from infertune.tuner.candidate import Candidate

    try:
        return Candidate.from_dict(config).label()
    except (KeyError, TypeError, ValueError):
        return " ".join(str(v) for v in config.values())


def front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points of (latency down, throughput up), by latency."""
    out = [
        (x, y)
        for x, y in points
        if not any((ox <= x and oy >= y) and (ox < x or oy > y) for ox, oy in points)
    ]
    return sorted(set(out))


def make_plots(
    result: TuningResult, out: Path, importance: dict[str, float]
) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [t for t in result.trials if t.figures]
    made: list[tuple[str, str]] = []
    if not measured:
        return made

    def xy(t: TrialRecord) -> tuple[float, float]:
        return t.figures.get("e2eP95Ms", math.nan), t.figures.get("outputTokensPerSecond", 0.0)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, colour, pick in _KINDS:
        group = [xy(t) for t in measured if pick(t)]
        if group:
            ax.scatter([x for x, _ in group], [y for _, y in group], c=colour,
                       label=f"{label} ({len(group)})")  # fmt: skip
    line = front([p for p in map(xy, measured) if all(map(math.isfinite, p))])
    if line:
        ax.plot(*zip(*line, strict=True), "k--", marker="o", mfc="none", ms=11,
                label=f"Pareto front ({len(line)} configurations)")  # fmt: skip
    ax.set_xlabel(figure_label("e2eP95Ms"))
    ax.set_ylabel(figure_label("outputTokensPerSecond"))
    ax.set_title("Throughput vs latency")
    ax.legend(fontsize=8)
    fig.tight_layout()
    made.append(_save(fig, out / "pareto.png", "Throughput vs latency, with the Pareto front"))

    names = list(dict.fromkeys(k for t in measured for k in t.config))
    knobs = [k for k in names if len({str(t.config.get(k)) for t in measured}) > 1]
    if knobs:
        fig, axes = plt.subplots(1, len(knobs), figsize=(3.3 * len(knobs), 3.4), squeeze=False)
        for ax, knob in zip(axes[0], knobs, strict=True):
            values = sorted({str(t.config.get(knob)) for t in measured}, key=_natural)
            for i, v in enumerate(values):
                ys = [t.objective or 0.0 for t in measured if str(t.config.get(knob)) == v]
                ax.scatter([i] * len(ys), ys, c="tab:blue", alpha=0.6)
            ax.set_xticks(range(len(values)), values, rotation=45)
            ax.set_title(knob_label(knob), fontsize=8, wrap=True)
        axes[0][0].set_ylabel(_objective_label(result.objective))
        fig.tight_layout()
        made.append(_save(fig, out / "knobs.png", "Each knob's effect on the objective"))

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ordered = sorted(result.trials, key=lambda t: t.number)
    pick_best = min if result.objective == "cost-per-token" else max  # the cost is minimised
    best: list[float] = []
    running: float | None = None
    for t in ordered:
        if t.feasible and t.objective is not None:
            running = t.objective if running is None else pick_best(running, t.objective)
        best.append(math.nan if running is None else running)
    for label, colour, pick in _KINDS:
        group = [(t.number, t.objective or 0.0) for t in ordered if pick(t)]
        if group:
            ax.scatter([x for x, _ in group], [y for _, y in group], c=colour, label=label)
    ax.step([t.number for t in ordered], best, where="post", c="k", label="best feasible so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(_objective_label(result.objective))
    ax.legend(fontsize=8)
    fig.tight_layout()
    made.append(_save(fig, out / "history.png", "Optimisation history"))

    capacity = sorted((t for t in measured if "capacityRps" in t.figures),
                      key=lambda t: t.figures["capacityRps"], reverse=True)[:12]  # fmt: skip
    if capacity:
        fig, ax = plt.subplots(figsize=(8, 0.8 + 0.35 * len(capacity)))
        rows = list(range(len(capacity)))[::-1]
        win = result.best.number if result.best else None
        ax.barh(rows, [t.figures["capacityRps"] for t in capacity],
                color=["tab:green" if t.number == win else "tab:blue" for t in capacity],
                label="highest rate meeting every SLO")  # fmt: skip
        upper = [(t.figures["capacityUpperRps"], y) for t, y in zip(capacity, rows, strict=True)
                 if "capacityUpperRps" in t.figures]  # fmt: skip
        if upper:
            ax.scatter([x for x, _ in upper], [y for _, y in upper], marker="x", c="tab:red",
                       label="lowest rate missed")  # fmt: skip
        # One engine: its name in every label says nothing.
        names = [config_label(t.config) for t in capacity]
        if len({t.config.get("engine") for t in capacity}) == 1:
            names = [n.split("/", 1)[-1] for n in names]
        ax.set_yticks(rows, names, fontsize=7)
        ax.set_xlabel(figure_label("capacityRps"))
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2)
        fig.tight_layout()
        made.append(_save(fig, out / "capacity.png", "SLO capacity of the best configurations (winner in green)"))  # fmt: skip

    race = result.race or {}
    ratios: list[tuple[str, dict[str, Any]]] = [(name, race[key]) for name, key in
              (("winner ÷ runner-up", "over_runner_up"), ("winner ÷ engine default", "over_default"))
              if (race.get(key) or {}).get("ratio") is not None]  # fmt: skip
    if ratios:
        fig, ax = plt.subplots(figsize=(7, 0.8 + 0.6 * len(ratios)))
        for y, (_, r) in enumerate(ratios):
            mean = float(r["ratio"])
            lo, hi = r.get("low"), r.get("high")
            err = [[mean - lo], [hi - mean]] if lo is not None and hi is not None else None
            ax.errorbar([mean], [y], xerr=err, fmt="o", c="k", capsize=5,
                        label="mean ratio, 95% interval" if y == 0 else None)  # fmt: skip
        ax.axvline(1.0, ls="--", c="tab:gray", label="no difference")
        ax.set_yticks(range(len(ratios)), [n for n, _ in ratios])
        ax.set_ylim(-0.7, len(ratios) - 0.3)
        ax.set_xlabel("ratio of mean objective over repeated runs")
        ax.legend(fontsize=8)
        fig.tight_layout()
        made.append(_save(fig, out / "confidence.png", "The winner's advantage, with its confidence interval"))  # fmt: skip

    if importance:
        fig, ax = plt.subplots(figsize=(7, 0.8 + 0.35 * len(importance)))
        labels = list(importance)
        ax.barh([knob_label(n.split("@")[0]) for n in labels], [importance[n] for n in labels])
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
    fig.savefig(path, dpi=90, bbox_inches="tight")  # long tick labels stay in the picture
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name, title
