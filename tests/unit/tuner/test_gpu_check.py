"""scripts/gpu_check.sh --dry-run: the GPU check's code paths on the CPU with tiny sizes (engine in
every precision, ceilings, a 2-trial builtin study with profiling and quality in a child), CUDA-only
steps skipped with a reason. On a GPU machine the same script runs without --dry-run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_gpu_check_dry_run_takes_every_step_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_TIMEOUT_S": "240"}
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path / "study")],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "== built-in engine on cpu" in out
    for precision in ("fp32", "bf16", "fp16", "fp8", "int8", "int4"):
        assert f"\n  {precision} " in out
    assert "CUDA graphs need a CUDA device (dry run: skipped)" in out
    assert "== ceilings on CPU" in out and "== builtin study: 2 trials" in out
    assert "in a child process" in out  # profiling isolated as on a GPU
    assert done.stdout.rstrip().endswith("gpu check: ok")
