"""The human report: report.html, one self-contained page (headings, tables, the plots inline as
data: URIs, so it opens anywhere and can be mailed as one file), and report.md with the same
content for terminals, the plots beside it as PNG files.

Both come from one list of blocks (`sections`); the HTML names every figure and knob the way a
person reads it ("TTFT p95 (ms)", the knob's own description) where the Markdown keeps the wire
keys (`ttftP95Ms`) that scripts grep for. Plots: the throughput/latency trade-off with its Pareto
front drawn, each knob's effect, the history, the SLO capacity of the best configurations, the
winner's measured advantage with its confidence interval (racing), and parameter importance.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infertune.tuner.report_labels import figure_label, knob_label
from infertune.tuner.report_plots import config_label, make_plots
from infertune.tuner.result import TrialRecord, TuningResult


@dataclass
class Heading:
    level: int
    text: str


@dataclass
class Para:
    text: str
    strong: str = ""  # a bold lead-in ("Status:")


@dataclass
class Table:
    head: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Items:
    items: list[str] = field(default_factory=list)


@dataclass
class Image:
    name: str  # the PNG's file name beside report.md
    title: str


Block = Heading | Para | Table | Items | Image


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return ""
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return "" if v is None else str(v)


def _cost_line(result: TuningResult) -> Para | None:
    """What the winner's output tokens cost, per million, and under which assumptions."""
    basis = result.cost_basis()
    if basis is None or result.best is None:
        return None
    tps = result.best.figures.get("outputTokensPerSecond")
    if not basis.known:
        hours = basis.gpu_hours_per_million(tps)
        return Para(
            f"GPU price unknown (set spec.hardware.gpuHourlyPrice or the chart's "
            f"gpuHourlyPrices): {_fmt(hours)} GPU-hours per million output tokens "
            f"({basis.gpus} GPU).",
            "Cost:",
        )
    return Para(f"${_fmt(result.cost_per_million(result.best))} per million output tokens "
                f"({basis.unit}, at {_fmt(tps)} output tokens/s).", "Cost:")  # fmt: skip


def _ratio(r: dict[str, Any] | None) -> str:
    """A race ratio: "1.38x (95% CI 1.21-1.57; 4 vs 4 runs)"."""
    if not r or r.get("ratio") is None:
        return "not measured"
    text = f"{r['ratio']:.2f}x"
    n = r.get("n") or [0, 0]
    if r.get("low") is not None and r.get("high") is not None:
        level = round(100 * float(r.get("level") or 0.95))
        text += f" ({level}% CI {r['low']:.2f}-{r['high']:.2f}; {n[0]} vs {n[1]} runs)"
    else:
        text += f" ({n[0]} vs {n[1]} runs: too few for an interval)"
    return text


def _same(config: dict[str, Any], other: dict[str, Any]) -> bool:
    return all(config.get(k) == v for k, v in other.items() if k in config)


def default_trial(result: TuningResult) -> TrialRecord | None:
    """The engine's default configuration among the measured trials (the race names it)."""
    default = (result.race or {}).get("default")
    if not default:
        return None
    found = [t for t in result.trials if t.figures and _same(t.config, default)]
    return max(found, key=lambda t: t.number, default=None)


def _versus(result: TuningResult, human: bool) -> list[Block]:
    best, base = result.best, default_trial(result)
    if best is None or base is None or best.number == base.number:
        return []
    name = knob_label if human else str
    fig = figure_label if human else str
    rows = [[name(k), str(v), str(base.config.get(k, ""))] for k, v in best.config.items()]
    rows += [[fig(k), _fmt(v), _fmt(base.figures.get(k))] for k, v in best.figures.items()]
    out: list[Block] = [Heading(2, "Winner vs the engine's default"),
                        Table(["", "winner", "default"], rows)]  # fmt: skip
    over = (result.race or {}).get("over_default")
    if over:
        out.append(Para(f"{_ratio(over)} the default's {result.objective}.", "Winner ÷ default:"))
    return out


def _confidence(result: TuningResult) -> list[Block]:
    race = result.race
    if not race:
        return []
    out: list[Block] = [Heading(2, "Confidence (racing)")]
    out.append(Para(f"{race.get('reason') or ''} ({race.get('remeasured', 0)} re-measurements).",
                    "Settled:" if race.get("settled") else "Not settled:"))  # fmt: skip
    out.append(Table(["comparison", "ratio of mean objective"], [
        ["winner ÷ runner-up", _ratio(race.get("over_runner_up"))],
        ["winner ÷ engine default", _ratio(race.get("over_default"))],
    ]))  # fmt: skip
    measured = race.get("measurements") or {}
    if measured:
        out.append(Table(["contender", "runs", "measured objective"],
                         [[k, str(len(v)), ", ".join(_fmt(float(x)) for x in v)] for k, v in measured.items()]))  # fmt: skip
    return out


def _winner(result: TuningResult, human: bool) -> list[Block]:
    b = result.best
    if b is None:
        return []
    title = "Winner" if result.status == "succeeded" else "Closest configuration (SLOs not met)"
    knobs = [[knob_label(k) if human else k, str(v)] for k, v in b.config.items()]
    rows = []
    for key, value in b.figures.items():
        metric = key[:4] if key.startswith("ttft") else key[:3]
        margin = b.margins_ms.get(metric) if key.endswith(("P95Ms", "P99Ms", "P50Ms")) else None
        rows.append([figure_label(key) if human else key, _fmt(value), _fmt(margin)])
    out: list[Block] = [Heading(2, title), Table(["knob", "value"], knobs),
                        Table(["metric", "measured", "SLO margin (ms)"], rows)]  # fmt: skip
    cost = _cost_line(result)
    return [*out, cost] if cost else out


def _profile(result: TuningResult) -> list[Block]:
    p = result.profile_wire
    if not p:
        return []
    rows = []
    for q, prof in (result.profile or {}).get("precisions", {}).items():
        for phase in ("prefill", "decode"):
            ph = prof[phase]
            rows.append([q, phase, ph["bound"], _fmt(ph["measured_ms"]), _fmt(ph["floor_ms"]),
                         _fmt(ph["percent_of_roofline"])])  # fmt: skip
    return [
        Heading(2, "Profile"),
        Para(
            f"{p.get('hardware')}: {_fmt(p.get('memoryBandwidthGbps'))} GB/s, "
            f"{_fmt(p.get('peakTflops'))} TFLOP/s peak"
        ),
        Table(["precision", "phase", "bound", "measured ms", "floor ms", "% of roofline"], rows),
    ]


def _trials(result: TuningResult, human: bool) -> list[Block]:
    head = ["#", "configuration", "outcome", "objective",
            "TTFT p95 (ms)" if human else "ttft p95", "ITL p95 (ms)" if human else "itl p95",
            "$/1M tokens", "note"]  # fmt: skip
    # The cost column covers every measured configuration, the engine's defaults included when
    # they were among the trials, so the winner's saving over them reads off the table.
    rows = [
        [f"{t.number}{'*' if t.seeded else ''}",
         config_label(t.config) if human else " ".join(str(v) for v in t.config.values()),
         t.outcome, _fmt(t.objective), _fmt(t.figures.get("ttftP95Ms")),
         _fmt(t.figures.get("itlP95Ms")), _fmt(result.cost_per_million(t)), (t.reason or "")[:80]]
        for t in sorted(result.trials, key=lambda t: t.number)
    ]  # fmt: skip
    return [Heading(2, "Trials"), Table(head, rows), Para("(* seeded from the roofline model)")]


def sections(result: TuningResult, plots: list[tuple[str, str]], *, human: bool) -> list[Block]:
    """The report's content; `human` labels figures and knobs for a reader (the HTML)."""
    out: list[Block] = [Heading(1, f"Tuning report: {result.study}")]
    if human:
        out.append(Para(f"{result.status} — {result.reason}", "Status:"))
    else:  # the Markdown's status line, as it has always read
        out.append(Para(f"**Status: {result.status}** — {result.reason}"))
    out.append(Para(f"Hardware: {result.hardware.get('product')} ({result.hardware.get('kind')})"))
    out += _versus(result, human)
    out += _winner(result, human)
    if result.binding_constraint:
        out.append(Para(result.binding_constraint, "Binding constraint:"))
    out += _confidence(result)
    out += _profile(result)
    pruned = (result.space or {}).get("pruned", [])
    if pruned:
        out += [Heading(2, "Pruned before any trial"), Items(
            [f"{p['engine']} {p['knob']}={p['value']} ({p['rule']}): {p['reason']}" for p in pruned]
        )]  # fmt: skip
    if result.quality:
        rows = [[q, f"{r['top1_agreement']:.3f}", f"{r['kl_divergence']:.4f}", str(r["passed"])]
                for q, r in result.quality.items()]  # fmt: skip
        out += [Heading(2, "Quality guard"),
                Table(["precision", "top-1 agreement", "KL", "passed"], rows)]  # fmt: skip
    out += _trials(result, human)
    for name, title in plots:
        out += [Heading(2, title), Image(name, title)]
    return out


# ------------------------------------------------------------------ renderers


def _md(block: Block) -> list[str]:
    if isinstance(block, Heading):
        return ["#" * block.level + " " + block.text, ""]
    if isinstance(block, Para):
        return [(f"**{block.strong}** " if block.strong else "") + block.text, ""]
    if isinstance(block, Table):
        lines = ["| " + " | ".join(block.head) + " |", "|" + "---|" * len(block.head)]
        return [*lines, *("| " + " | ".join(r) + " |" for r in block.rows), ""]
    if isinstance(block, Items):
        return [*(f"- {i}" for i in block.items), ""]
    return [f"![{block.title}]({block.name})", ""]


def markdown(result: TuningResult, plots: list[tuple[str, str]]) -> str:
    return "\n".join(line for b in sections(result, plots, human=False) for line in _md(b))


def _html(block: Block, images: dict[str, bytes]) -> str:
    e = html.escape
    if isinstance(block, Heading):
        return f"<h{block.level}>{e(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        lead = f"<strong>{e(block.strong)}</strong> " if block.strong else ""
        return f"<p>{lead}{e(block.text)}</p>"
    if isinstance(block, Table):
        head = "".join(f"<th>{e(h)}</th>" for h in block.head)
        body = "".join(
            "<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in block.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if isinstance(block, Items):
        return "<ul>" + "".join(f"<li>{e(i)}</li>" for i in block.items) + "</ul>"
    data = base64.b64encode(images.get(block.name, b"")).decode()
    return (f"<figure><img src='data:image/png;base64,{data}' alt='{e(block.title)}'>"
            f"<figcaption>{e(block.title)}</figcaption></figure>")  # fmt: skip


_STYLE = """
body{font:15px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em;border-bottom:2px solid #444}h2{font-size:1.25em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #ccc;padding:3px 8px;
text-align:left}th{background:#eee}tbody tr:nth-child(even){background:#fafafa}
figure{margin:1em 0}img{max-width:100%}figcaption{color:#555;font-size:.9em}
"""


def html_page(result: TuningResult, plots: list[tuple[str, str]], images: dict[str, bytes]) -> str:
    body = "\n".join(_html(b, images) for b in sections(result, plots, human=True))
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(f'Tuning report: {result.study}')}</title>"
            f"<style>{_STYLE}</style></head><body>\n{body}\n</body></html>\n")  # fmt: skip


def write_report(result: TuningResult, out: Path, importance: dict[str, float]) -> Path:
    """Write report.html (self-contained), report.md and the PNGs under `out`; return the HTML."""
    out.mkdir(parents=True, exist_ok=True)
    plots = make_plots(result, out, importance)
    (out / "report.md").write_text(markdown(result, plots))
    images = {name: (out / name).read_bytes() for name, _ in plots}
    path = out / "report.html"
    path.write_text(html_page(result, plots, images))
    return path
