"""report.html is a page a person reads: real HTML (headings, tables, the plots in place as data:
URIs, one self-contained file), human labels with units, the capacity and confidence figures, the
winner beside the engine's default, a Pareto plot whose legend matches what is drawn. Checked in a
real browser: Debian's chromium, headless, takes a screenshot of the page (installed with apt when
missing, as services.py installs PostgreSQL on a fresh machine)."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from infertune.tuner.report import write_report
from infertune.tuner.report_labels import figure_label, knob_label
from infertune.tuner.report_plots import front
from infertune.tuner.result import TrialRecord, TuningResult

DEFAULT = {"engine": "builtin", "quantization": "fp32", "max_num_seqs": 8,
           "max_num_batched_tokens": 512, "kv_block_size": 16, "cuda_graph": False}  # fmt: skip


def trial(n: int, q: str, seqs: int, capacity: float, *, ok: bool = True, outcome: str = "ok") -> TrialRecord:  # fmt: skip
    figures = {
        "ttftP95Ms": 300.0 + 40 * seqs, "itlP95Ms": 12.0 + seqs, "e2eP95Ms": 900.0 + 60 * seqs,
        "goodputRps": min(capacity, 4.0), "outputTokensPerSecond": 30.0 * seqs + (20 if q == "int4" else 0),
        "capacityRps": capacity, "capacityUpperRps": capacity * 1.3, "capacityProbes": 3.0,
    }  # fmt: skip
    return TrialRecord(n, {**DEFAULT, "quantization": q, "max_num_seqs": seqs}, outcome, ok,
                       capacity, figures=figures, margins_ms={"ttft": 500.0, "itl": 20.0})  # fmt: skip


def result() -> TuningResult:
    trials = [
        trial(0, "fp32", 8, 9.8),  # the engine's default
        trial(1, "int4", 8, 13.75),
        trial(2, "int8", 16, 11.0),
        trial(3, "bf16", 32, 0.0, ok=False, outcome="stopped"),
        trial(4, "int4", 4, 7.5),
    ]
    race = {
        "winner": trials[1].config, "settled": True, "reason": "settled: every contender separated",
        "remeasured": 6, "runner_up": trials[2].config, "default": DEFAULT,
        "over_runner_up": {"ratio": 1.21, "low": 1.08, "high": 1.36, "n": [4, 4], "level": 0.95},
        "over_default": {"ratio": 1.38, "low": 1.22, "high": 1.57, "n": [4, 3], "level": 0.95},
        "measurements": {"int4 8 seqs": [13.7, 13.9, 13.5, 13.8], "int8 16 seqs": [11.0, 11.4, 11.2, 11.5]},
    }  # fmt: skip
    return TuningResult(
        study="demo-1234", status="succeeded", reason="best of 4 feasible configurations",
        hardware={"product": "CPU test", "kind": "cpu"}, objective="goodput", slo={},
        trials=trials, trials_total=5, best=trials[1], race=race,
    )  # fmt: skip


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.images: list[str] = []
        self.headers: list[str] = []
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in.append(tag)
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")

    def handle_endtag(self, tag: str) -> None:
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        if self._in and self._in[-1] in ("style", "title"):
            return
        self.text.append(data)
        if self._in and self._in[-1] == "th":
            self.headers.append(data)


def test_labels_are_for_people() -> None:
    assert figure_label("ttftP95Ms") == "TTFT p95 (ms)"
    assert figure_label("e2eP99Ms") == "End-to-end latency p99 (ms)"
    assert figure_label("goodputRps") == "Goodput (req/s)"
    assert figure_label("capacityRps") == "SLO capacity (req/s)"
    assert figure_label("queueWaitMs") == "Queue wait (ms)"
    assert knob_label("max_num_seqs") == "Most sequences batched at once"
    assert knob_label("kv_block_size") == "KV-cache page size in tokens"


def test_the_front_is_the_non_dominated_points() -> None:
    points = [(100.0, 10.0), (200.0, 30.0), (150.0, 5.0), (300.0, 30.0), (400.0, 50.0)]
    assert front(points) == [(100.0, 10.0), (200.0, 30.0), (400.0, 50.0)]


def test_report_html_is_one_self_contained_page_of_real_html(tmp_path: Path) -> None:
    path = write_report(result(), tmp_path, {"quantization": 0.7, "max_num_seqs": 0.3})
    page = Page()
    page.feed(path.read_text())
    text = " ".join(page.text)
    assert "pre" not in page.tags and "|---|" not in text and "![" not in text
    assert (
        page.tags.count("h1") == 1 and page.tags.count("h2") >= 6 and page.tags.count("table") >= 4
    )
    # Wire keys became labels with units.
    assert "ttftP95Ms" not in text and "TTFT p95 (ms)" in page.headers + page.text
    assert "SLO capacity (req/s)" in text and "Most sequences batched at once" in text
    # The winner beside the default, and the confidence of the difference.
    assert "Winner vs the engine's default" in text
    assert "1.38x (95% CI 1.22-1.57; 4 vs 3 runs)" in text
    assert "1.21x (95% CI 1.08-1.36; 4 vs 4 runs)" in text
    # Every plot is in the page: a PNG as a data: URI, nothing fetched from beside it.
    assert len(page.images) == 6, [s[:40] for s in page.images]
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"(src|href)=['\"](?!data:)", path.read_text())
    md = (tmp_path / "report.md").read_text()
    assert (
        "| ttftP95Ms |" in md
        and "![Throughput vs latency, with the Pareto front](pareto.png)" in md
    )


def _chromium() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    from services import apt_install  # scripts/devcluster, on pytest's pythonpath

    try:
        apt_install("chromium")
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"Debian's chromium package could not be installed ({exc}): no browser check")
    return shutil.which("chromium") or pytest.fail("apt installed chromium but it is not on PATH")


def test_a_real_browser_renders_headings_tables_and_the_plots(tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image

    path = write_report(result(), tmp_path / "report", {"quantization": 0.7})
    browser = _chromium()
    shot = tmp_path / "shot.png"
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1200,4200", "--virtual-time-budget=5000"]  # fmt: skip
    run = subprocess.run([*common, f"--screenshot={shot}", path.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    dom = subprocess.run([*common, "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    # What the browser built: headings and tables, not a <pre> of Markdown.
    assert "<h1>Tuning report: demo-1234</h1>" in dom and dom.count("<table>") >= 4
    assert "<pre" not in dom
    pixels = np.asarray(Image.open(io.BytesIO(shot.read_bytes())).convert("RGB")).reshape(-1, 3)
    # Not blank: mostly the white page, but with text, table borders and plots on it.
    white = (pixels > 245).all(axis=1).mean()
    assert 0.3 < white < 0.97, white
    colours = {tuple(p) for p in pixels[:: max(1, len(pixels) // 200_000)]}
    assert len(colours) > 200, len(colours)

    # The images loaded: the plots' own colours (matplotlib's tab:green and tab:blue markers,
    # used nowhere in the page's CSS) are on the screen.
    def share(rgb: tuple[int, int, int]) -> float:
        return float((np.abs(pixels.astype(int) - rgb).sum(axis=1) < 40).mean())

    assert share((44, 160, 44)) > 1e-4 and share((31, 119, 180)) > 1e-4
