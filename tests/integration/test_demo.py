"""`make demo` run non-interactively: the story it tells must have happened on the cluster (winner,
rollout, live check, TrafficDrift retune) and the teardown must leave no process behind.

Each test starts its own control plane through the demo script (not the session fixture).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import alive

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.py"

pytestmark = pytest.mark.cluster


def _leftovers(record: dict[str, Any]) -> list[str]:
    """Processes the demo started that are still there, or any process of its cluster's state dir."""
    out = [f"{name} pid {pid}" for name, pid in record.get("pids", {}).items() if alive(pid)]
    state = record.get("state_dir")
    if state:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                text = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
            except OSError:
                continue
            if state.encode() in text and alive(int(proc.name)):
                out.append(f"pid {proc.name}: {(proc / 'cmdline').read_bytes()[:200]!r}")
        assert not Path(state).exists(), f"cluster state dir left behind: {state}"
    return out


def _run_demo(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(DEMO), "--out", str(tmp_path / "out"), "--record", str(tmp_path / "record.json"),
         "--namespace", "demo-test", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_ctrl_c_tears_everything_down(tmp_path: Path) -> None:
    proc = _run_demo(tmp_path)
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 600
    for line in proc.stdout:
        seen.append(line)
        if "=== 4/8" in line or time.monotonic() > deadline:
            break  # control plane, Prometheus and the operator are up; the tuning Job is starting
    time.sleep(5)  # the tuning pod is running by now
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    out = "".join(seen) + rest
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted: tearing down" in out and "teardown done" in out, out[-3000:]
    record = json.loads((tmp_path / "record.json").read_text())
    assert {"operator", "prometheus", "kube-apiserver", "etcd"} <= set(record["pids"]), record
    assert _leftovers(record) == []


@pytest.mark.slow
@pytest.mark.timeout(3600)  # two real tuning studies on the CPU: ~15-20 min on 2 busy cores
def test_the_demo_tells_the_whole_story(tmp_path: Path) -> None:
    proc = _run_demo(tmp_path)
    out, _ = proc.communicate(timeout=3600)
    print(out)
    assert proc.returncode == 0, out[-5000:]
    record = json.loads((tmp_path / "record.json").read_text())
    # Profile -> winner -> rollout
    assert record["profile"]["hardware"]
    assert record["winner"]["engine"] == "builtin" and record["winner"]["configHash"]
    assert record["rollout"]["config"] == record["winner"]["configHash"]
    first = record["runs"][0]
    assert first["reason"] == "Created" and first["node"] == "gpu-h100-0" and first["trials"] >= 1
    # Live SLO check from Prometheus under real load
    assert record["live_check"]["source"] == "prometheus"
    assert record["live_check"]["figures"]["requestRate"] > 0
    # Longer prompts -> TrafficDrift retune, a second tuning run, then its verdict (and a rollout)
    # TrafficDrift is the story; on a machine too busy to hold the SLOs the violation fires first
    # (the operator checks SLOs before drift), which is a retune all the same.
    retune = record["retune"]
    assert retune["reason"] in ("TrafficDrift", "SLOViolation"), retune
    if retune["reason"] == "TrafficDrift":
        assert "promptTokens" in retune["message"], retune
    second = record["runs"][1]
    assert second["reason"] == retune["reason"] and second["job"] != first["job"]
    events = [h["event"] for h in record["history"]]
    assert "RetuneTriggered" in events and record["retune"]["verdict"] in (
        "RetuneAccepted",
        "RetuneKept",
    )
    if record["retune"]["verdict"] == "RetuneAccepted":
        assert record["new_rollout"]["config"] == record["retune"]["best"]["configHash"]
        assert record["new_rollout"]["config"] != record["rollout"]["config"]
    for run in record["runs"]:
        assert run["report"] and (ROOT / run["report"]).is_file(), run
    assert "=== Summary" in out and "report (Created):" in out
    assert _leftovers(record) == []
