"""The native fp32 kernels: torch's results, used where they can run, torch's ops where not."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infertune.engine import kernels
from infertune.engine.kernels import PanelLinear, describe, native_kernels
from infertune.engine.quant import PlainLinear, make_linear

needs_kernel = pytest.mark.skipif(
    native_kernels() is None, reason=f"no native kernels on this host: {describe()}"
)


def _case(rows: int, depth: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows * 1000 + depth + width)
    x = torch.randn(rows, depth, generator=gen)
    weight = torch.randn(width, depth, generator=gen) * depth**-0.5
    residual = torch.randn(rows, width, generator=gen)
    return x, weight, residual


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 130])
@pytest.mark.parametrize(("depth", "width"), [(256, 384), (768, 256), (64, 16)])
def test_panel_layers_give_torchs_products_for_every_row_count(
    rows: int, depth: int, width: int
) -> None:
    x, weight, residual = _case(rows, depth, width)
    bias = torch.randn(width)
    plain = PanelLinear(weight, None, native_kernels())  # type: ignore[arg-type]
    biased = PanelLinear(weight, bias, native_kernels())  # type: ignore[arg-type]
    expected = x @ weight.T
    # One FMA chain per element against MKL's blocked sums: equal to fp32 rounding.
    torch.testing.assert_close(plain(x), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(biased(x), expected + bias, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain.add_to(residual, x), residual + expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        biased.add_to(residual, x), residual + expected + bias, rtol=1e-5, atol=1e-5
    )


@needs_kernel
def test_strided_rows_and_threads_do_not_change_the_result() -> None:
    x, weight, residual = _case(64, 256, 384)
    layer = PanelLinear(weight, None, native_kernels())  # type: ignore[arg-type]
    wide = torch.randn(64, 512)
    wide[:, :256] = x  # rows with a stride of 512: a view like qkv's slices
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = layer.add_to(residual, x)
        torch.set_num_threads(2)  # 64 rows: the panels are shared among the threads
        shared = layer.add_to(residual, x)
        strided = layer.add_to(residual, wide[:, :256])
    finally:
        torch.set_num_threads(previous)
    # Each element is the same FMA chain whichever thread computes it: bit-identical.
    assert torch.equal(single, shared)
    assert torch.equal(single, strided)


@needs_kernel
def test_fp32_and_bf16_cpu_layers_take_the_panel_kernels_and_others_keep_torch_mm() -> None:
    weight = torch.randn(48, 32)
    assert isinstance(make_linear(weight, None, quantization="fp32", device="cpu"), PanelLinear)
    # 20 outputs are not whole panels; fp16 has no panel kernel.
    odd = make_linear(torch.randn(20, 32), None, quantization="fp32", device="cpu")
    assert isinstance(odd, PlainLinear)
    bf16 = make_linear(weight, None, quantization="bf16", device="cpu")
    assert isinstance(bf16, kernels.Bf16PanelLinear)
    assert isinstance(make_linear(weight, None, quantization="fp16", device="cpu"), PlainLinear)
    with pytest.raises(ValueError, match="20 output features are not a multiple of 16"):
        kernels.pack_panels(torch.randn(20, 32))


def _describe_in_subprocess(env: dict[str, str]) -> str:
    code = (
        "from infertune.engine.kernels import describe\n"
        "from infertune.engine.quant import make_linear\n"
        "import torch\n"
        "layer = make_linear(torch.randn(32, 32), None, quantization='fp32', device='cpu')\n"
        "print(type(layer).__name__, '|', describe())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def test_without_a_working_compiler_fp32_models_stay_on_torch_ops(tmp_path: Path) -> None:
    env = {"CC": "false", "INFERTUNE_CACHE": str(tmp_path), "INFERTUNE_KERNEL_DIR": ""}
    out = _describe_in_subprocess(env)
    assert out.startswith("PlainLinear | torch ops (native kernels unavailable: false failed"), out
    assert _describe_in_subprocess({"INFERTUNE_NATIVE_KERNELS": "0"}) == (
        "PlainLinear | torch ops (INFERTUNE_NATIVE_KERNELS=0)"
    )


@needs_kernel
def test_a_prebuilt_kernel_dir_serves_hosts_without_a_compiler(tmp_path: Path) -> None:
    prebuilt = kernels.build(tmp_path / "prebuilt")
    # No compiler at all: only the prebuilt library can make the kernel available.
    env = {"CC": "false", "INFERTUNE_CACHE": str(tmp_path / "empty")}
    out = _describe_in_subprocess({**env, "INFERTUNE_KERNEL_DIR": str(prebuilt.parent)})
    isa = "AVX512-BF16" if native_kernels().bf16_isa else "AVX2"  # type: ignore[union-attr]
    assert out == f"PanelLinear | native kernels, bf16 on {isa} ({prebuilt})"


@needs_kernel
def test_the_kernel_runs_on_torchs_own_openmp_threads() -> None:
    # A second OpenMP runtime would bring a second pool of spinning threads onto the same cores.
    code = (
        "import torch\n"
        "from infertune.engine.kernels import native_kernels\n"
        "assert native_kernels() is not None\n"
        "maps = open('/proc/self/maps').read().splitlines()\n"
        "print(sorted({l.split()[-1] for l in maps if 'gomp' in l or 'iomp' in l}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    runtimes = ast.literal_eval(done.stdout)
    assert len(runtimes) == 1, runtimes


def _reference_attention(
    q: torch.Tensor, cache: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """Per sequence and head: gather the cached K/V in token order, softmax(q K^T) V."""
    _, kv_heads, _, block_size, _ = cache.shape
    group = q.shape[1] // kv_heads
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        n = int(lens[b])
        blocks = tables[b, : -(-n // block_size)]
        for head in range(q.shape[1]):
            g = head // group
            keys = cache[0, g, blocks].reshape(-1, cache.shape[-1])[:n]
            values = cache[1, g, blocks].reshape(-1, cache.shape[-1])[:n]
            probs = torch.softmax((keys @ q[b, head]) * scale, dim=0)
            out[b, head] = probs @ values
    return out


@needs_kernel
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size", "lens"),
    [
        (8, 2, 32, 16, [1, 16, 17, 150, 31, 64, 5, 200]),  # the tiny model's GQA shape
        (4, 4, 64, 4, [3, 9]),  # no grouping, small blocks, a 64-wide head
        (6, 1, 8, 32, [40]),  # one kv head for six query heads, an 8-wide head
    ],
)
def test_decode_attention_reads_the_paged_cache_as_a_gathered_softmax_would(
    heads: int, kv_heads: int, head_dim: int, block_size: int, lens: list[int]
) -> None:
    gen = torch.Generator().manual_seed(heads * 100 + head_dim)
    num_blocks = 64
    cache = torch.randn(2, kv_heads, num_blocks, block_size, head_dim, generator=gen)
    width = max(-(-n // block_size) for n in lens)
    # Scattered, non-monotonic blocks per sequence, padded with block 0 as the engine pads.
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(lens), width, dtype=torch.int64)
    used = 0
    for b, n in enumerate(lens):
        count = -(-n // block_size)
        tables[b, :count] = order[used : used + count]
        used += count
    context = torch.tensor(lens, dtype=torch.int64)
    # q rows strided like the engine's slice of the fused qkv output.
    qkv = torch.randn(len(lens), (heads + 2 * kv_heads) * head_dim, generator=gen)
    q = qkv[:, : heads * head_dim].view(len(lens), heads, head_dim)
    scale = head_dim**-0.5
    kernel = native_kernels()
    assert kernel is not None
    got = kernel.decode_attention(q, cache, tables, context, scale)
    expected = _reference_attention(q, cache, tables, context, scale)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@needs_kernel
def test_inputs_that_do_not_fit_are_refused_before_native_code_runs() -> None:
    kernel = native_kernels()
    assert kernel is not None
    panels = kernels.pack_panels(torch.randn(32, 64))
    with pytest.raises(ValueError, match=r"panel matmul of torch.float32 \[2, 48\]"):
        kernel.matmul(torch.randn(2, 48), panels, None)
    with pytest.raises(ValueError, match="panel matmul init"):
        kernel.matmul(torch.randn(2, 64), panels, torch.randn(3, 32))
    cache = torch.randn(2, 2, 8, 4, 32)
    q = torch.randn(1, 8, 32)
    tables = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match=r"lens \[9\]"):  # 9 tokens in 2 blocks of 4
        kernel.decode_attention(q, cache, tables, torch.tensor([9]), 1.0)
