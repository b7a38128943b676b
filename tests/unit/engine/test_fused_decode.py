"""The bf16 panel GEMM (both ISAs) and the fused decode step against torch's own ops."""

from __future__ import annotations

import pytest
import torch
from model_reference import tiny_model

from infertune.engine import kernels
from infertune.engine.kernels import NativeKernels, describe, native_kernels
from infertune.engine.runner import ModelRunner, SamplingParams, StepInput

needs_kernel = pytest.mark.skipif(
    native_kernels() is None, reason=f"no native kernels on this host: {describe()}"
)


def _isas() -> list[int]:
    kernel = native_kernels()
    return [0, 1] if kernel is not None and kernel.bf16_isa else [0]


def _kernel_for(isa: int, monkeypatch: pytest.MonkeyPatch) -> NativeKernels:
    kernel = native_kernels()
    assert kernel is not None
    monkeypatch.setenv("INFERTUNE_BF16_ISA", "avx2" if isa == 0 else "")
    forced = NativeKernels(kernel.lib, kernel.path)
    assert forced.bf16_isa == isa
    return forced


@needs_kernel
@pytest.mark.parametrize("isa", _isas())
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 16, 17, 33])
@pytest.mark.parametrize(("depth", "width"), [(576, 960), (64, 48), (130, 80)])
def test_bf16_panels_give_the_exact_products_summed_in_fp32(
    isa: int, rows: int, depth: int, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + depth + width)
    x = torch.randn(rows, depth, generator=gen).bfloat16()
    weight = (torch.randn(width, depth, generator=gen) * depth**-0.5).bfloat16()
    kernel = _kernel_for(isa, monkeypatch)
    got = kernel.bf16_matmul(x, kernels.pack_bf16_panels(weight))
    # bf16 x bf16 products are exact in fp32; only the order of the fp32 sums differs.
    expected = x.double() @ weight.double().T
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    # Strided rows (a view into a wider buffer) read the same numbers.
    wide = torch.zeros(rows, depth + 6, dtype=torch.bfloat16)
    wide[:, :depth] = x
    assert torch.equal(kernel.bf16_matmul(wide[:, :depth], kernels.pack_bf16_panels(weight)), got)


@needs_kernel
def test_bf16_panels_refuse_what_does_not_fit() -> None:
    kernel = native_kernels()
    assert kernel is not None
    with pytest.raises(ValueError, match="does not pack into bf16 panels"):
        kernels.pack_bf16_panels(torch.randn(32, 63))
    panels = kernels.pack_bf16_panels(torch.randn(32, 64))
    with pytest.raises(ValueError, match="bf16 panel matmul"):
        kernel.bf16_matmul(torch.randn(2, 64), panels)  # fp32 rows
    with pytest.raises(ValueError, match="bf16 panel matmul"):
        kernel.bf16_matmul(torch.randn(2, 62).bfloat16(), panels)


LENS = [5, 17, 33, 150, 64, 1 + 16 * 3]  # a new token landing on a block's first slot, too


def _tables() -> list[list[int]]:
    blocks = torch.randperm(80, generator=torch.Generator().manual_seed(7)).tolist()
    tables, used = [], 0
    for n in LENS:
        count = -(-(n + 1) // 16)
        tables.append(blocks[used : used + count])
        used += count
    return tables


def _new_slots() -> list[list[int]]:
    """[block, offset] of each sequence's new token, sorted as nonzero() lists them."""
    return sorted([t[n // 16], n % 16] for t, n in zip(_tables(), LENS, strict=True))


def _decode_twice(
    quantization: str, monkeypatch: pytest.MonkeyPatch, isa: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step of six sequences (scattered blocks), fused and on torch's ops, from the
    same KV cache: (fused logits, ops logits, fused cache, ops cache)."""
    runner = ModelRunner(
        tiny_model(), quantization=quantization, kv_block_size=16, num_kv_blocks=80
    )
    model = runner.model
    fused = model.fused
    assert fused is not None
    if isa is not None:
        fused.kernel = _kernel_for(isa, monkeypatch)
    gen = torch.Generator().manual_seed(8)
    tables = _tables()
    greedy = SamplingParams()
    for s, n in enumerate(LENS):  # prefill on the ops path
        ids = torch.randint(3, 500, (n,), generator=gen).tolist()
        runner.execute([StepInput(s, ids, 0, tables[s], True, greedy)])
    step = [StepInput(s, [11 + s], n, tables[s], True, greedy) for s, n in enumerate(LENS)]
    before = runner.kv_cache.clone()
    fused_logits, _ = runner.forward_logits(step)
    fused_cache = runner.kv_cache.clone()
    runner.kv_cache.copy_(before)
    model.fused = None
    ops_logits, _ = runner.forward_logits(step)
    return fused_logits, ops_logits, fused_cache, runner.kv_cache


@needs_kernel
def test_fused_fp32_step_equals_the_ops_path(monkeypatch: pytest.MonkeyPatch) -> None:
    fused, ops, fused_cache, ops_cache = _decode_twice("fp32", monkeypatch)
    torch.testing.assert_close(fused_cache, ops_cache, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused, ops, rtol=1e-4, atol=1e-4 * float(ops.abs().max()))


@needs_kernel
@pytest.mark.parametrize("isa", _isas())
def test_fused_bf16_step_follows_the_ops_path(isa: int, monkeypatch: pytest.MonkeyPatch) -> None:
    fused, ops, fused_cache, ops_cache = _decode_twice("bf16", monkeypatch, isa)
    # Both round to bf16 at every op; they differ where the ops path rounds attention scores
    # to bf16 and the fused step keeps them fp32, by a few bf16 steps of the logits.
    top = float(ops.abs().max())
    assert float((fused - ops).abs().max()) < 0.05 * top
    assert torch.equal(fused.argmax(-1), ops.argmax(-1))
    # The new token's K/V land in the same slots and nothing else moves.
    differs = (fused_cache != ops_cache).any(dim=-1).any(dim=2).any(dim=1).any(dim=0)
    assert differs.nonzero().tolist() == [
        [table, offset]
        for table, offset in _new_slots()
        if differs[table, offset]  # a slot may come out bit-identical
    ]
    # Deeper layers' K/V inherit the hidden state's rounding differences: a few bf16 steps.
    gap = (fused_cache.float() - ops_cache.float()).abs().max()
    assert float(gap) < 0.05 * float(ops_cache.float().abs().max())
