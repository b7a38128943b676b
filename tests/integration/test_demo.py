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
import uuid
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import alive, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

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


def _run_demo(
    tmp_path: Path, *extra: str, namespace: str = "demo-test", env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    # Started with SIGINT ignored, as a CI runner or a non-interactive shell's background job
    # starts it (the child inherits SIG_IGN): Ctrl-C must tear the demo down all the same.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return subprocess.Popen(
            [sys.executable, str(DEMO), "--out", str(tmp_path / "out"), "--record", str(tmp_path / "record.json"),
             "--namespace", namespace, *extra],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_once(proc: subprocess.Popen[str], marker: str, timeout: float = 600) -> str:
    """SIGINT the demo a few seconds after ``marker`` appears in its output; the whole output."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if marker in line or time.monotonic() > deadline:
            break
    time.sleep(5)  # the tuning pod is running by now
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=180)
    return "".join(seen) + rest


def test_ctrl_c_on_an_existing_cluster_deletes_the_demo_namespace(
    cluster: Any, api: Any, tmp_path: Path
) -> None:
    """`make demo CLUSTER=existing` on a cluster the user keeps: after Ctrl-C the demo's namespace
    is gone, not left Terminating on the finalizer of an operator that was stopped first."""
    namespace = f"demo-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    proc = _run_demo(tmp_path, "--cluster", "existing", namespace=namespace, env=env)
    out = _interrupt_once(proc, "tuning Job")  # the InferenceService exists, with the finalizer
    assert proc.returncode == 130, out[-3000:]
    assert "teardown done" in out, out[-3000:]

    def namespace_gone() -> bool:
        try:
            client.CoreV1Api(api).read_namespace(namespace)
        except ApiException as e:
            return e.status == 404
        return False

    wait_for(namespace_gone, f"namespace {namespace} deleted", timeout=90)
    record = json.loads((tmp_path / "record.json").read_text())
    assert _leftovers(record) == []


def test_ctrl_c_tears_everything_down(tmp_path: Path) -> None:
    proc = _run_demo(tmp_path)
    # At step 4 the control plane, Prometheus and the operator are up; the tuning Job is starting.
    out = _interrupt_once(proc, "=== 4/8")
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
