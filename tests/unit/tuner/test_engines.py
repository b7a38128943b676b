"""Every adapter turns a configuration into the argv its engine documents, and refuses what it cannot express."""

from __future__ import annotations

import pytest

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import ADAPTERS, AdapterError, get_adapter
from infertune.tuner.hardware import Hardware
from infertune.tuner.knobs import SERVING_KNOBS


def cfg(engine: str, quant: str = "bf16", graph: bool = False) -> Candidate:
    return Candidate(engine, quant, 16, 1024, 32, graph)


def flag(argv: list[str], name: str) -> str:
    assert name in argv, f"{name} missing from {argv}"
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_every_adapter_conforms(name: str, cpu: Hardware, gpu: Hardware) -> None:
    adapter = get_adapter(name)
    assert adapter.name == name
    assert adapter.health_path.startswith("/")
    # Its flag table maps exactly the declared knobs it honours (infertune.tuner.knobs).
    assert set(adapter.knob_flags) == {k.name for k in SERVING_KNOBS.honoured_by(name)}
    for hw in (cpu, gpu):
        caps = adapter.capabilities(hw)
        assert caps.quantizations
        if not hw.is_gpu:
            assert True not in caps.cuda_graph, "CUDA graphs offered on a CPU"
    quant = sorted(adapter.capabilities(gpu).quantizations)[0]
    argv = adapter.command(cfg(name, quant), "/models/m", "0.0.0.0", 8000, served_model_name="m")
    assert "8000" in argv and "/models/m" in argv
    with pytest.raises(AdapterError, match=r"not supported by|has no"):
        adapter.launch(Candidate(name, "fp64", 1, 1, 16, False), "/m", "h", 1)


def test_builtin_argv_matches_the_serving_contract() -> None:
    argv = get_adapter("builtin").command(
        Candidate("builtin", "int8", 8, 512, 64, False), "builtin://tiny", "10.0.0.5", 8000,
        served_model_name="tiny-llama",
    )  # fmt: skip
    assert argv[:2] == ["infertune", "serve"]
    assert flag(argv, "--model") == "builtin://tiny"
    assert flag(argv, "--served-model-name") == "tiny-llama"
    assert flag(argv, "--quantization") == "int8"
    assert flag(argv, "--max-num-seqs") == "8"
    assert flag(argv, "--max-num-batched-tokens") == "512"
    assert flag(argv, "--kv-block-size") == "64"
    assert argv[-1] == "--no-cuda-graph"


def test_vllm_flags() -> None:
    v = get_adapter("vllm")
    argv = v.command(cfg("vllm", "bf16"), "/m", "127.0.0.1", 9000)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flag(argv, "--dtype") == "bfloat16"
    assert flag(argv, "--max-num-seqs") == "16"
    assert flag(argv, "--max-num-batched-tokens") == "1024"
    assert flag(argv, "--block-size") == "32"
    assert "--enforce-eager" in argv
    fp8 = v.command(cfg("vllm", "fp8", graph=True), "/m", "h", 1)
    assert flag(fp8, "--quantization") == "fp8"
    assert "--enforce-eager" not in fp8
    sizes = fp8[fp8.index("--cudagraph-capture-sizes") + 1 :]
    assert sizes and max(int(s) for s in sizes if s.isdigit()) <= 16
    with pytest.raises(AdapterError, match="maxNumBatchedTokens"):
        v.command(Candidate("vllm", "bf16", 64, 32, 16, False), "/m", "h", 1)


def test_llamacpp_flags() -> None:
    a = get_adapter("llamacpp")
    argv = a.command(cfg("llamacpp", "int4"), "/m/model.gguf", "127.0.0.1", 9000)
    assert flag(argv, "--model") == "/m/model.gguf"
    assert flag(argv, "-np") == "16"
    assert flag(argv, "-b") == "1024"
    assert flag(argv, "-ub") == "512"
    assert flag(argv, "-ctk") == flag(argv, "-ctv") == "q8_0"
    assert flag(argv, "-fa") == "on"  # a quantized V cache needs flash attention
    assert int(flag(argv, "-c")) == 16 * 1024  # context is shared by the slots
    fp32 = a.command(cfg("llamacpp", "fp32"), "/m.gguf", "h", 1)
    assert flag(fp32, "-ctk") == "f32"
    assert a.env(cfg("llamacpp", "fp32")) == {"GGML_CUDA_DISABLE_GRAPHS": "1"}


def test_sglang_flags(cpu: Hardware) -> None:
    s = get_adapter("sglang")
    argv = s.command(cfg("sglang", "fp8"), "/m", "0.0.0.0", 30000)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert flag(argv, "--quantization") == "fp8"
    assert flag(argv, "--max-running-requests") == "16"
    assert flag(argv, "--chunked-prefill-size") == "1024"
    assert flag(argv, "--page-size") == "32"
    assert "--disable-cuda-graph" in argv
    assert not s.capabilities(cpu).runnable


def test_unknown_engine_names_the_choices() -> None:
    with pytest.raises(AdapterError, match="allowed values"):
        get_adapter("tensorrt")


def test_restart_needed_unless_only_runtime_knobs_change(cpu: Hardware) -> None:
    a = get_adapter("builtin")
    base = cfg("builtin")
    assert not a.needs_restart(base, base, cpu)
    assert a.needs_restart(base, Candidate("builtin", "int8", 16, 1024, 32, False), cpu)
