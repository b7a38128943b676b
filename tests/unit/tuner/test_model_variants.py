"""model.variants: int8/int4 on vLLM/SGLang only through the spec's pre-quantized checkpoint.

The checkpoints are tiny directories whose config.json carries a quantization_config: the method
is read from there, no quantized weights are needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from infertune.tuner.api import TuningSpec
from infertune.tuner.api.model import VARIANT_METHODS
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import EngineOptions, get_adapter
from infertune.tuner.hardware import Hardware
from infertune.tuner.models import resolve_model, variant_methods
from infertune.tuner.space import build_space
from infertune.tuner.trial import TrialRunner

GPU = Hardware(kind="gpu", product="NVIDIA H100 80GB HBM3", count=1, memory_bytes=80 << 30)
DATA = Path(__file__).parents[2] / "data/engine_help"
ENGINES = ["vllm", "sglang"]


def checkpoint(root: Path, name: str, method: str | None) -> Path:
    path = root / name
    path.mkdir()
    config: dict[str, Any] = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    if method:
        config["quantization_config"] = {"quant_method": method, "bits": 4}
    (path / "config.json").write_text(json.dumps(config))
    return path


def spec(base: Path, engines: list[str], variants: dict[str, Any] | None = None) -> TuningSpec:
    model: dict[str, Any] = {"uri": str(base)}
    if variants is not None:
        model["variants"] = variants
    return TuningSpec.model_validate(
        {
            "model": model,
            "slo": {"ttft": {"max": "500ms"}},
            "traffic": {"rate": 4, "numRequests": 20},
            "search": {"engines": engines, "quantizations": ["bf16", "int8", "int4"]},
        }
    )


def adapters(engines: list[str], s: TuningSpec) -> dict[str, Any]:
    # The options as recorded (no engine installed here): SGLang's "installed" probe stubbed.
    out = {}
    for e in engines:
        a = get_adapter(
            e,
            options=EngineOptions(e, "0", {}, complete=False),
            quant_methods=variant_methods(s.model),
        )
        a.missing = lambda: None  # type: ignore[method-assign]
        out[e] = a
    return out


def pruned(space: Any, engine: str, q: str) -> str | None:
    return next(
        (
            p.reason
            for p in space.pruned
            if (p.engine, p.knob, p.value) == (engine, "quantization", q)
        ),
        None,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_method_read_from_the_checkpoint_config(tmp_path: Path, engine: str) -> None:
    awq = checkpoint(tmp_path, "model-awq", "awq")
    s = spec(checkpoint(tmp_path, "base", None), [engine], {"int4": {"uri": f"file://{awq}"}})
    space = build_space(s, GPU, adapters([engine], s))
    assert "int4" in space.engines[engine].quantizations
    assert space.engines[engine].quantization_methods == {"int4": "awq"}
    assert space.to_dict()["engines"][engine]["quantizationMethods"] == {"int4": "awq"}
    argv = adapters([engine], s)[engine].flags(
        Candidate(engine, "int4", 16, 4096, 16, False), str(awq), "h", 1
    )
    assert argv[argv.index("--quantization") + 1] == "awq"
    assert argv[argv.index("--dtype") + 1] == "auto"
    # int8 has no variant: pruned, saying exactly what to provide.
    reason = pruned(space, engine, "int8")
    assert reason is not None and "model.variants.int8.uri" in reason and "AWQ/GPTQ" in reason


@pytest.mark.parametrize("engine", ENGINES)
def test_the_spec_method_wins_over_the_config(tmp_path: Path, engine: str) -> None:
    gptq = checkpoint(tmp_path, "model-gptq", "gptq")
    variants = {"int4": {"uri": str(gptq), "method": "gptq_marlin"}}
    s = spec(checkpoint(tmp_path, "base", None), [engine], variants)
    assert variant_methods(s.model) == {"int4": "gptq_marlin"}
    space = build_space(s, GPU, adapters([engine], s))
    assert space.engines[engine].quantization_methods == {"int4": "gptq_marlin"}


@pytest.mark.parametrize("engine", ENGINES)
def test_unknown_method_is_pruned_with_what_to_set(tmp_path: Path, engine: str) -> None:
    plain = checkpoint(tmp_path, "model-int8", None)  # config.json without quantization_config
    variants = {"int8": {"uri": str(plain)}, "int4": {"uri": "hf://org/model-AWQ"}}  # not local
    s = spec(checkpoint(tmp_path, "base", None), [engine], variants)
    assert variant_methods(s.model) == {"int8": None, "int4": None}
    space = build_space(s, GPU, adapters([engine], s))
    assert space.engines[engine].quantizations == ["bf16"]
    for q in ("int8", "int4"):
        reason = pruned(space, engine, q)
        assert reason is not None and f"set model.variants.{q}.method" in reason


@pytest.mark.parametrize("engine", ENGINES)
def test_no_variant_is_pruned_with_what_to_provide(tmp_path: Path, engine: str) -> None:
    s = spec(checkpoint(tmp_path, "base", None), [engine])
    space = build_space(s, GPU, adapters([engine], s))
    for q in ("int8", "int4"):
        reason = pruned(space, engine, q)
        assert reason is not None
        assert f"model.variants.{q}.uri" in reason and "AWQ/GPTQ checkpoint" in reason


def test_builtin_and_llamacpp_ignore_variants(tmp_path: Path) -> None:
    awq = checkpoint(tmp_path, "model-awq", "awq")
    base = checkpoint(tmp_path, "base", None)
    s = spec(base, ["vllm"], {"int4": {"uri": str(awq)}})
    for engine in ("builtin", "llamacpp"):
        assert resolve_model(s.model, "int4", engine) == base
    assert resolve_model(s.model, "int4", "vllm") == awq
    assert resolve_model(s.model, "bf16", "vllm") == base


def test_the_trial_loads_the_variant(tmp_path: Path) -> None:
    awq = checkpoint(tmp_path, "model-awq", "awq")
    base = checkpoint(tmp_path, "base", None)
    s = spec(base, ["vllm", "sglang"], {"int4": {"uri": f"file://{awq}"}})
    runner = TrialRunner(s, base, tmp_path / "work", GPU)
    assert runner.model_for(Candidate("vllm", "int4", 16, 4096, 16, False)) == awq
    assert runner.model_for(Candidate("sglang", "int4", 16, 4096, 16, False)) == awq
    assert runner.model_for(Candidate("vllm", "bf16", 16, 4096, 16, False)) == base
    assert runner.model_for(Candidate("builtin", "int4", 16, 4096, 16, False)) == base
    assert runner.adapter("vllm").quant_methods == {"int4": "awq"}


@pytest.mark.parametrize(
    ("variants", "field", "says"),
    [
        ({"int3": {"uri": "/m"}}, "model.variants.int3", "['int8', 'int4']"),
        ({"int4": "hf://org/m-AWQ"}, "model.variants.int4", "must be an object"),
        ({"int4": {"uri": "s3://b/m"}}, "variants.int4.uri", "['file', 'pvc', 'hf', 'builtin']"),
        ({"int4": {"uri": "/a/../b"}}, "variants.int4.uri", "parent references"),
        ({"int4": {"uri": "/m", "method": "bitsandbytes"}}, "variants.int4.method", "'awq'"),
    ],
)
def test_validation_names_the_field_and_the_allowed_values(
    tmp_path: Path, variants: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(ValidationError) as err:
        spec(tmp_path, ["vllm"], variants)
    assert field in str(err.value) and says in str(err.value)


def test_methods_are_among_the_engines_recorded_choices() -> None:
    options = json.loads((DATA / "sglang-0.5.23.json").read_text())["options"]
    assert set(VARIANT_METHODS) <= set(options["--quantization"]["choices"])
    for name in ("vllm-0.32.0", "vllm-0.10.2"):  # vLLM's parser takes any method string
        vllm = json.loads((DATA / f"{name}.json").read_text())["options"]["--quantization"]
        assert vllm["takes_value"] and vllm["choices"] is None
