"""`infertune tune` end to end with the built-in engine on the tiny model (real engines, real load)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SPEC = """
model: {{uri: "builtin://tiny", name: tiny}}
slo:
  ttft: {{max: {ttft}, percentile: p95}}
  itl: {{max: 200ms, percentile: p95}}
traffic:
  rate: 4
  promptTokens: {{distribution: fixed, mean: 32}}
  outputTokens: {{distribution: fixed, mean: 8}}
  numRequests: 12
  warmupRequests: 1
search:
  engines: [builtin]
  quantizations: [fp32, int8]
  maxNumSeqs: {{values: [1, 8]}}
  maxNumBatchedTokens: {{values: [128]}}
  kvBlockSizes: [16]
  seed: 1
quality: {{enabled: false}}
budget: {{maxTrials: {trials}, trialTimeout: 2m}}
"""


def tune(tmp: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "infertune.tuner.cli", str(tmp / "spec.yaml"), "--out", str(tmp / "out"),
         "--termination-message", str(tmp / "term"), "--no-profile", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_infeasible_slo_gives_a_clear_report(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC.format(ttft="1ms", trials=2))
    proc = tune(tmp_path)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "term").read_text())
    assert summary["status"] == "infeasible"
    assert summary["bindingConstraint"].startswith("ttft p95 <= 1ms: best achieved")
    assert summary["best"]["engine"] == "builtin"
    assert "binding constraint: ttft p95 <= 1ms" in out
    assert (tmp_path / "out/report.md").read_text().count("Binding constraint") == 1


def test_resume_after_sigkill(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC.format(ttft="2s", trials=4))
    proc = tune(tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:  # kill it while the second trial runs
        if "trial 1/4" in line:
            time.sleep(3)
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    db = tmp_path / "out/study.db"
    with sqlite3.connect(db) as con:
        states = [s for (s,) in con.execute("select state from trials order by number")]
    assert states.count("COMPLETE") == 1 and "RUNNING" in states
    # The rerun sees the dead worker's trial as stale once its heartbeat is older than --stale-after.
    time.sleep(6)
    rerun = tune(tmp_path, "--stale-after", "5")
    out, _ = rerun.communicate(timeout=900)
    assert rerun.returncode == 0, out
    summary = json.loads((tmp_path / "term").read_text())
    assert summary["trialsCompleted"] == 4
    with sqlite3.connect(db) as con:
        states = [s for (s,) in con.execute("select state from trials order by number")]
    assert "RUNNING" not in states and states.count("FAIL") == 1
