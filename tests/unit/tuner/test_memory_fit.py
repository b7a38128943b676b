"""Memory fit: weights + one sequence's KV must fit a replica's memory share, else pruned before
any trial; a model the built-in engine cannot serve removes only `builtin` from the space."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from infertune.tuner.api import TuningSpec
from infertune.tuner.hardware import GpuSpec, gpu_spec
from infertune.tuner.memory_fit import MemoryBudget, context_tokens, memory_fit, prune_by_memory
from infertune.tuner.model_shape import ModelShape
from infertune.tuner.roofline import datasheet_ceilings, decode_floor, prefill_floor
from infertune.tuner.space import EngineSpace, Space
from infertune.tuner.tune import TuneOptions, prune_before_trials

CONFIGS = Path(__file__).parents[2] / "data" / "model_configs"


def _gpu(name: str) -> GpuSpec:
    g = gpu_spec(name)
    assert g is not None, name
    return g


H100, L4 = _gpu("H100-80GB"), _gpu("L4-24GB")

# (model, GPU) -> precisions that fit one GPU at a 4096-token context under vLLM's 0.9.
FITS = {
    ("llama-3.1-8b", "H100-80GB"): {"bf16", "int8", "int4"},
    ("llama-3.1-8b", "L4-24GB"): {"bf16", "int8", "int4"},
    ("qwen3-8b", "H100-80GB"): {"bf16", "int8", "int4"},
    ("qwen3-8b", "L4-24GB"): {"bf16", "int8", "int4"},
    ("gemma-2-9b", "H100-80GB"): {"bf16", "int8", "int4"},
    ("gemma-2-9b", "L4-24GB"): {"bf16", "int8", "int4"},  # 17.2 GiB + 1.3 GiB KV <= 20.3 GiB
    ("phi-3-mini-4k", "H100-80GB"): {"bf16", "int8", "int4"},
    ("phi-3-mini-4k", "L4-24GB"): {"bf16", "int8", "int4"},
    ("mixtral-8x7b", "H100-80GB"): {"int8", "int4"},  # bf16 is 87.0 GiB
    ("mixtral-8x7b", "L4-24GB"): set(),  # even int4 is 24.6 GiB
}


def spec(**model: Any) -> TuningSpec:
    return TuningSpec.model_validate(
        {
            "model": {"uri": "file:///models/x", **model},
            "slo": {"itl": {"max": "100ms"}},
            "traffic": {
                "concurrency": 4,
                "promptTokens": {"distribution": "lognormal", "mean": 1000, "p95": 3000},
                "outputTokens": {"distribution": "uniform", "min": 100, "max": 1100},
            },
        }
    )


def test_context_is_max_model_len_else_prompt_and_output_p95() -> None:
    assert context_tokens(spec()) == 3000 + 1050
    assert context_tokens(spec(maxModelLen=8192)) == 8192


@pytest.mark.parametrize(("model", "gpu"), sorted(FITS))
def test_five_models_on_h100_and_l4_without_weights(model: str, gpu: str) -> None:
    g = _gpu(gpu)
    shape = ModelShape.from_dir(CONFIGS / model)
    budget = MemoryBudget.of(g.hardware())
    fits = {q for q in ("bf16", "int8", "int4") if memory_fit(shape, "vllm", q, 4096, budget).fits}
    assert fits == FITS[(model, gpu)]
    # The analytic profile: decode at batch 1 reads the weights (memory-bound), a long prefill
    # is compute-bound, and the floors scale with the GPU's datasheet figures.
    c = datasheet_ceilings(g)
    decode = decode_floor(shape, c, "bf16", 1, 4096)
    assert decode.bound == "memory"
    assert decode.memory_ms >= shape.read_bytes("bf16") / (g.memory_bandwidth_gbps * 1e9) * 1e3
    assert prefill_floor(shape, c, "int4", 4096).bound == "compute"


def test_a_70b_bf16_on_one_80gb_gpu_is_pruned_with_the_arithmetic() -> None:
    shape = ModelShape.from_dir(CONFIGS / "llama-3.1-70b")
    assert shape.total_params == pytest.approx(70.6e9, rel=0.02)
    space = Space(
        {"vllm": EngineSpace("vllm", ["bf16", "int8", "int4"], [1, 8], [512], [16], [False])}
    )
    fits = prune_by_memory(
        space, spec(maxModelLen=4096), shape, H100.hardware(), MemoryBudget.of(H100.hardware())
    )
    assert [f.fits for f in fits] == [False, True, True]
    (pruned,) = space.pruned
    assert (pruned.engine, pruned.knob, pruned.value, pruned.rule) == (
        "vllm",
        "quantization",
        "bf16",
        "memory",
    )
    assert pruned.reason == (
        "bf16 weights 131.4 GiB + KV 1.2 GiB for 1 seq x 4096 tokens > 0.9 x 79.6 GiB "
        "(NVIDIA H100 80GB HBM3)"
    )
    # Two GPUs per replica: the same bf16 weights fit.
    two = memory_fit(shape, "vllm", "bf16", 4096, MemoryBudget.of(H100.hardware(2)))
    assert two.fits and "0.9 x 2 x 79.6 GiB" in two.text()


def test_gpu_catalogue_matches_nvml_names() -> None:
    assert gpu_spec("NVIDIA H100 80GB HBM3") is H100
    assert gpu_spec("NVIDIA L4") is L4
    assert gpu_spec("NVIDIA L40S") is None  # not an L4


def _model_dir(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    out.mkdir()
    shutil.copy(CONFIGS / name / "config.json", out / "config.json")
    return out


def _space(*engines: str, quants: tuple[str, ...] = ("bf16", "int4")) -> Space:
    return Space({e: EngineSpace(e, list(quants), [1, 8], [512], [16], [False]) for e in engines})


def test_a_model_the_builtin_engine_cannot_serve_removes_only_builtin(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "gemma-2-9b")
    space = _space("builtin", "vllm")
    logs: list[str] = []
    opts = TuneOptions("s", tmp_path, log=logs.append)
    analysis = prune_before_trials(spec(), model, H100.hardware(), space, opts)
    assert list(space.engines) == ["vllm"] and space.engines["vllm"].quantizations == [
        "bf16",
        "int4",
    ]
    (why,) = space.pruned
    assert why.engine == "builtin" and why.rule == "capability"
    assert "built-in engine cannot serve" in why.reason and "Gemma2ForCausalLM" in why.reason
    assert analysis.shape is not None and len(analysis.memory_fit) == 2
    assert any("Gemma2ForCausalLM" in line for line in logs)


def test_nothing_that_fits_ends_with_the_arithmetic(tmp_path: Path) -> None:
    model = _model_dir(tmp_path, "llama-3.1-70b")
    with pytest.raises(ValueError, match=r"int4 weights 38\.4 GiB .* > 0\.9 x 22\.5 GiB"):
        prune_before_trials(
            spec(),
            model,
            L4.hardware(),
            _space("vllm"),
            TuneOptions("s", tmp_path, log=lambda _m: None),
        )


def test_an_unreadable_config_skips_the_fit_and_keeps_the_space(tmp_path: Path) -> None:
    space = _space("vllm")
    analysis = prune_before_trials(
        spec(),
        tmp_path,
        L4.hardware(),
        space,
        TuneOptions("s", tmp_path, log=lambda _m: None),
    )
    assert analysis.shape is None and list(space.engines) == ["vllm"]
