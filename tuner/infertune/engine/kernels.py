"""The engine's native CPU kernels (fp32 and bf16, AVX2 + FMA, AVX512-BF16 where the CPU has
it), built at first use and loaded with ctypes.

**Panel GEMM** (``native/panel_sgemm.c``). A decode step multiplies a handful of rows (one per
running sequence) by every weight once. For that shape MKL's sgemm is far from the machine's
limits: it repacks an operand on every call and walks the ``[in, out]`` weight 64 bytes per
row, and on a host whose last-level cache is smaller than the weights it then waits on memory.
The kernel keeps each weight as 16-column panels (each a contiguous ``[in, 16]`` block, one
sequential stream) and the rows in registers. Measured on this project's 2-core AVX2 host
(8 MiB L3), the tiny model's 17 weights in turn, one thread: 8 rows 2.4 vs 4.0 ms, 32 rows 7.4
vs 8.7 ms, 1 and 512 rows on par (``bench_runner``'s GEMM rows measure it side by side).

**Decode attention** (``native/decode_attention.c``) reads K and V straight from the paged
cache through each sequence's block table, where the torch path first gathers them into a
copy: batch 8, ~150 cached tokens, one layer: 154 vs ~400 us here.

**bf16 panel GEMM** (``native/panel_bgemm.c``): the same panels of bf16 k-pairs, multiplied
with AVX512-BF16's ``vdpbf16ps`` (fp32 sums) where the CPU has it and with AVX2 widening
otherwise. On SmolLM2-135M's weights at one row it ran 4x faster than torch's bf16 ``mm``
here (16 vs 61 us for the 960x576 QKV weight, 2.1 vs 29 ms for the 49152x576 LM head).

**Fused decode step** (``native/fused_decode.c``, driven by :mod:`infertune.engine.fused`):
every layer of a decode-only step in one call, see its source.

This module is the engine's one adapter to native code: it finds a C compiler, builds the
library into the cache (``$INFERTUNE_KERNEL_DIR`` holds prebuilt ones, e.g. in the images), and
loads it with ctypes, which releases the GIL for each call. Anything missing (not x86-64 Linux,
no AVX2/FMA, no compiler, a failed build, ``INFERTUNE_NATIVE_KERNELS=0``) leaves fp32 models on
torch's ops, with the reason in :func:`describe`; nothing fails for want of the kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

PANEL = 16  # columns per panel: two AVX2 registers
NATIVE = Path(__file__).with_name("native")
SOURCES = tuple(
    NATIVE / n for n in ("panel_sgemm.c", "decode_attention.c", "panel_bgemm.c", "fused_decode.c")
)
HEADERS = (NATIVE / "simd.h",)
CFLAGS = ("-O3", "-mavx2", "-mfma", "-shared", "-fPIC")
OPENMP = "-fopenmp"  # dropped (one thread) where the compiler has no OpenMP
ABI = 4
AVX512_BF16_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_bf16"})
# Steps with at least this many rows share their panels among torch's threads (the runner
# raises their number for prefill steps); below it a fork-join costs more than it saves.
PARALLEL_ROWS = 16

_c_long, _ptr = ctypes.c_long, ctypes.c_void_p


class NativeKernels:
    """The loaded library; each method's contract is in its C source."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        fn = lib.infertune_panel_sgemm
        fn.restype = None
        fn.argtypes = [_ptr, _c_long, _c_long, _c_long, _ptr, _c_long, _c_long]
        fn.argtypes += [_ptr, _c_long, _ptr, _c_long, ctypes.c_int]
        self._fn = fn
        att = lib.infertune_decode_attention
        att.restype = None
        att.argtypes = [_ptr, _c_long, _c_long, _c_long, _c_long, _ptr, _c_long, _c_long]
        att.argtypes += [_ptr, _c_long, _ptr, _c_long, ctypes.c_float, _ptr, _ptr, _c_long]
        att.argtypes += [ctypes.c_int]
        self._attention = att
        bg = lib.infertune_panel_bgemm
        bg.restype = None
        bg.argtypes = [_ptr, _c_long, _c_long, _c_long, _ptr, _c_long, _ptr, _c_long]
        bg.argtypes += [ctypes.c_int, ctypes.c_int]
        self._bgemm = bg
        self.lib = lib  # the fused decode step binds its own entry points (fused.py)
        self.path = path
        # 1: vdpbf16ps (AVX512-BF16), 0: the AVX2 widening path; the C side trusts this.
        # INFERTUNE_BF16_ISA=avx2 forces the fallback (its tests run on AVX512 hosts too).
        forced = os.environ.get("INFERTUNE_BF16_ISA") == "avx2"
        self.bf16_isa = int(not forced and _cpu_flags() >= AVX512_BF16_FLAGS)

    def matmul(
        self, x: torch.Tensor, panels: torch.Tensor, init: torch.Tensor | None
    ) -> torch.Tensor:
        """``init + x @ W`` for ``W`` packed by :func:`pack_panels`.

        ``x`` is ``[M, K]`` fp32; ``init`` is None, a ``[N]`` bias or an ``[M, N]`` tensor.
        """
        if x.stride(-1) != 1:
            x = x.contiguous()
        rows, depth = x.shape
        num_panels = panels.shape[0]
        # The C side trusts every shape and dtype: a mismatch here would be memory corruption.
        if x.dtype != torch.float32 or depth != panels.shape[1] or x.device.type != "cpu":
            raise ValueError(f"panel matmul of {x.dtype} {list(x.shape)} by {list(panels.shape)}")
        if init is not None and (
            init.dtype != torch.float32
            or init.shape[-1] != num_panels * PANEL
            or (init.dim() == 2 and init.shape[0] != rows)
        ):
            raise ValueError(f"panel matmul init {init.dtype} {list(init.shape)} for {rows} rows")
        out = torch.empty(rows, num_panels * PANEL, dtype=torch.float32)
        init_ptr, ldi = None, 0
        if init is not None:
            if init.stride(-1) != 1:
                init = init.contiguous()
            init_ptr = init.data_ptr()
            ldi = 0 if init.dim() == 1 else init.stride(0)  # 0: one bias row for every row

        parallel = int(rows >= PARALLEL_ROWS and torch.get_num_threads() > 1)
        self._fn(
            x.data_ptr(), rows, depth, x.stride(0), panels.data_ptr(), 0, num_panels,
            init_ptr, ldi, out.data_ptr(), out.stride(0), parallel,
        )  # fmt: skip
        return out

    def bf16_matmul(self, x: torch.Tensor, panels: torch.Tensor) -> torch.Tensor:
        """``x @ W`` in fp32 for bf16 ``x`` ``[M, K]`` and ``W`` packed by :func:`pack_bf16_panels`."""
        if x.stride(-1) != 1:
            x = x.contiguous()
        rows, depth = x.shape
        num_panels, pairs = panels.shape[0], panels.shape[1]
        if (
            x.dtype != torch.bfloat16
            or panels.dtype != torch.bfloat16
            or depth != 2 * pairs
            or x.device.type != "cpu"
        ):
            raise ValueError(
                f"bf16 panel matmul of {x.dtype} {list(x.shape)} by {list(panels.shape)}"
            )
        out = torch.empty(rows, num_panels * PANEL, dtype=torch.float32)
        parallel = int(rows >= PARALLEL_ROWS and torch.get_num_threads() > 1)
        self._bgemm(
            x.data_ptr(), rows, depth, x.stride(0), panels.data_ptr(), num_panels,
            out.data_ptr(), out.stride(0), self.bf16_isa, parallel,
        )  # fmt: skip
        return out

    def decode_attention(
        self,
        q: torch.Tensor,
        layer_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """Softmax attention of one query token per sequence over its cached tokens.

        ``q`` ``[B, heads, head_dim]`` (rows may be strided, heads contiguous), ``layer_cache``
        ``[2, kv_heads, blocks, block_size, head_dim]``, ``block_tables`` ``[B, max_blocks]``
        and ``context_lens`` ``[B]`` int64; returns ``[B, heads, head_dim]``.
        """
        batch, heads, head_dim = q.shape
        if q.stride(2) != 1 or q.stride(1) != head_dim:
            q = q.contiguous()
        _, kv_heads, num_blocks, block_size, _ = layer_cache.shape
        longest = block_tables.shape[1] * block_size
        # The C side trusts these (the runner has checked every block id against the cache).
        if (
            q.dtype != torch.float32
            or layer_cache.dtype != torch.float32
            or not layer_cache.is_contiguous()
            or block_tables.dtype != torch.int64
            or not block_tables.is_contiguous()
            or context_lens.dtype != torch.int64
            or not context_lens.is_contiguous()
            or block_tables.shape[0] != batch
            or context_lens.shape != (batch,)
            or head_dim % 8
            or heads % kv_heads
            or int(context_lens.max()) > longest
        ):
            raise ValueError(
                f"decode attention inputs do not fit: q {q.dtype} {list(q.shape)}, cache "
                f"{list(layer_cache.shape)}, tables {list(block_tables.shape)}, "
                f"lens {context_lens.tolist()}"
            )
        out = torch.empty(batch, heads, head_dim, dtype=torch.float32)
        ld_scratch = -(-longest // 8) * 8
        scratch = torch.empty(batch * heads * ld_scratch, dtype=torch.float32)
        parallel = int(batch >= 4 and torch.get_num_threads() > 1)
        self._attention(
            q.data_ptr(), q.stride(0), heads, kv_heads, head_dim,
            layer_cache.data_ptr(), num_blocks, block_size,
            block_tables.data_ptr(), block_tables.stride(0), context_lens.data_ptr(), batch,
            scale, out.data_ptr(), scratch.data_ptr(), ld_scratch, parallel,
        )  # fmt: skip
        return out


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """An ``[out, in]`` weight as ``[out / 16, in, 16]`` fp32 panels (``out % 16 == 0``)."""
    out_features, in_features = weight.shape
    if out_features % PANEL:
        raise ValueError(f"{out_features} output features are not a multiple of {PANEL}")
    w = weight.to(torch.float32)
    return w.reshape(out_features // PANEL, PANEL, in_features).transpose(1, 2).contiguous()


def pack_bf16_panels(weight: torch.Tensor) -> torch.Tensor:
    """An ``[out, in]`` weight as ``[out / 16, in / 2, 16, 2]`` bf16 panels of k-pairs."""
    out_features, in_features = weight.shape
    if out_features % PANEL or in_features % 2:
        raise ValueError(f"a {out_features}x{in_features} weight does not pack into bf16 panels")
    w = weight.to(torch.bfloat16).reshape(out_features // PANEL, PANEL, in_features // 2, 2)
    return w.permute(0, 2, 1, 3).contiguous()


class Bf16PanelLinear:
    """A bf16 CPU linear layer on the bf16 panel kernel; its output is rounded to bf16 once,
    as torch's bf16 ``mm`` rounds its fp32 sums."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel: NativeKernels):
        self.panels = pack_bf16_panels(weight)
        self.bias = None if bias is None else bias.to(torch.bfloat16)
        self.out_features = int(weight.shape[0])
        self._kernel = kernel

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self._kernel.bf16_matmul(x, self.panels).to(torch.bfloat16)
        return y if self.bias is None else y + self.bias

    @property
    def nbytes(self) -> int:
        return self.panels.numel() * self.panels.element_size()


class PanelLinear:
    """An fp32 CPU linear layer whose weight lives only as panels (no second copy)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel: NativeKernels):
        self.panels = pack_panels(weight)
        self.bias = None if bias is None else bias.to(torch.float32).contiguous()
        self.out_features = int(weight.shape[0])
        self._kernel = kernel

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._kernel.matmul(x, self.panels, self.bias)

    def add_to(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``h + self(x)`` in one pass: the kernel's accumulators start from ``h``."""
        init = h if self.bias is None else h + self.bias
        return self._kernel.matmul(x, self.panels, init)

    @property
    def nbytes(self) -> int:
        return self.panels.numel() * self.panels.element_size()


def describe() -> str:
    """Whether fp32 models run on the native kernels here, and why not (for the start-up log)."""
    kernel, reason = _load()
    if kernel is not None:
        isa = "AVX512-BF16" if kernel.bf16_isa else "AVX2"
        return f"native kernels, bf16 on {isa} ({kernel.path})"
    return f"torch ops ({reason})"


def native_kernels() -> NativeKernels | None:
    """The kernels, or None where they cannot run (the reason is logged once)."""
    return _load()[0]


@functools.cache
def _load() -> tuple[NativeKernels | None, str]:
    reason = _unsupported_reason()
    if reason:
        return None, reason
    try:
        path = _built_library()
        lib = ctypes.CDLL(str(path))
        if lib.infertune_kernels_abi() != ABI:
            raise OSError(f"{path} has ABI {lib.infertune_kernels_abi()}, want {ABI}")
        return NativeKernels(lib, path), ""
    except (OSError, subprocess.SubprocessError) as exc:
        reason = f"native kernels unavailable: {exc}"
        log.warning("fp32 models use torch ops: %s", reason)
        return None, reason


def _unsupported_reason() -> str:
    if os.environ.get("INFERTUNE_NATIVE_KERNELS", "1") == "0":
        return "INFERTUNE_NATIVE_KERNELS=0"
    unsupported = _platform_reason()
    if unsupported:
        return unsupported
    flags = _cpu_flags()
    missing = [f for f in ("avx2", "fma") if f not in flags]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    return ""


def _platform_reason() -> str:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return (
            f"the kernels are x86-64 Linux only (this is {platform.system()} {platform.machine()})"
        )
    return ""


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo), empty where there is none."""
    return _cpu_flags()


def library_name() -> str:
    """The file name of the build of the current kernel source (it hashes the source)."""
    return _library_name()


def _library_name() -> str:
    code = b"".join(p.read_bytes() for p in (*SOURCES, *HEADERS))
    digest = hashlib.sha256(code + " ".join(CFLAGS).encode())
    return f"infertune-kernels-{digest.hexdigest()[:16]}.so"


def _built_library() -> Path:
    """A build of the current source: prebuilt, cached, or compiled now into the cache."""
    name = _library_name()
    prebuilt = os.environ.get("INFERTUNE_KERNEL_DIR")
    if prebuilt and (Path(prebuilt) / name).is_file():
        return Path(prebuilt) / name
    cache = Path(os.environ.get("INFERTUNE_CACHE") or Path.home() / ".cache/infertune") / "kernels"
    target = cache / name
    if target.is_file():
        return target
    try:
        return build(cache)
    except PermissionError:  # a read-only home (a hardened pod): build where we can write
        return build(Path(tempfile.gettempdir()) / "infertune-kernels")


def build(directory: Path) -> Path:
    """Compile the kernels into ``directory`` (atomically: concurrent builders never clash).

    With OpenMP where the compiler has it, else without (the kernels then run on one thread).
    """
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise OSError("no C compiler found (set CC, or INFERTUNE_KERNEL_DIR to a prebuilt build)")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / _library_name()
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".so.tmp")
    os.close(fd)
    try:
        errors = []
        for flags in ((*CFLAGS, OPENMP), CFLAGS):
            done = subprocess.run(
                [compiler, *flags, "-o", tmp, *map(str, SOURCES)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode == 0:
                os.replace(tmp, target)
                log.info("built the native kernels (%s): %s", " ".join(flags), target)
                return target
            errors.append(done.stderr.strip()[-300:])
        raise OSError(f"{compiler} failed: {errors[-1]}")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


if __name__ == "__main__":  # image builds: python -m infertune.engine.kernels DIR
    import sys

    unsupported = _platform_reason()  # the build host's CPU flags do not matter, its ISA does
    print(f"no native kernels: {unsupported}" if unsupported else build(Path(sys.argv[1])))
