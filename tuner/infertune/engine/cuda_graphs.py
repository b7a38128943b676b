"""CUDA Graph capture of the decode step, one graph per batch-size bucket (the cuda_graph knob).

A decode-only step of ``B`` sequences replays the graph of the smallest bucket >= ``B``: inputs
are copied into static buffers, padding rows write their KV into a reserved scratch block and
attend one position, and the block tables are padded to ``max_model_len`` so every replay has
the same shapes. Prefill (and mixed) steps run eagerly. Only constructed on CUDA devices.
"""

from __future__ import annotations

import torch

from infertune.engine.model import BatchMeta, LlamaModel


def buckets(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, *range(8, max_num_seqs + 8, 8)]
    return sorted({min(s, max_num_seqs) for s in sizes})


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaModel,
        kv_cache: torch.Tensor,
        *,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        scratch_block: int,
    ) -> None:
        self.model, self.kv_cache, self.block_size = model, kv_cache, block_size
        self.scratch_block = scratch_block
        self.buckets = buckets(max_num_seqs)
        n, width, dev = self.buckets[-1], -(-max_model_len // block_size), kv_cache.device
        self.tokens = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slot_blocks = torch.full((n,), scratch_block, dtype=torch.int64, device=dev)
        self.slot_offsets = torch.zeros(n, dtype=torch.int64, device=dev)
        self.tables = torch.zeros((n, width), dtype=torch.int64, device=dev)
        self.lens = torch.ones(n, dtype=torch.int64, device=dev)
        self.rows = torch.arange(n, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture()

    def _meta(self, b: int) -> BatchMeta:
        return BatchMeta(
            positions=self.positions[:b],
            slot_blocks=self.slot_blocks[:b],
            slot_offsets=self.slot_offsets[:b],
            num_decode=b,
            decode_block_tables=self.tables[:b],
            decode_context_lens=self.lens[:b],
            prefills=[],
            sample_rows=self.rows[:b],
        )

    def _capture(self) -> None:
        pool = None
        for b in reversed(self.buckets):  # largest first, so smaller graphs reuse its pool
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside capture (cuBLAS workspaces etc.)
                for _ in range(2):
                    self.model.forward(self.tokens[:b], self._meta(b), self.kv_cache)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.model.forward(self.tokens[:b], self._meta(b), self.kv_cache)
            pool = graph.pool()
            self.graphs[b] = (graph, out)

    def fits(self, batch_size: int, max_blocks: int) -> bool:
        return batch_size <= self.buckets[-1] and max_blocks <= self.tables.shape[1]

    def run(self, tokens: torch.Tensor, meta: BatchMeta) -> torch.Tensor:
        """Logits of a decode-only step (rows in ``meta`` order), by graph replay."""
        n = tokens.shape[0]
        b = next(size for size in self.buckets if size >= n)
        self.tokens[:n].copy_(tokens)
        self.positions[:n].copy_(meta.positions)
        self.slot_blocks[:n].copy_(meta.slot_blocks)
        self.slot_offsets[:n].copy_(meta.slot_offsets)
        self.tables[:n].zero_()
        self.tables[:n, : meta.decode_block_tables.shape[1]].copy_(meta.decode_block_tables)
        self.lens[:n].copy_(meta.decode_context_lens)
        # Padding rows: scratch KV slot, one attended position.
        self.tokens[n:b].zero_()
        self.positions[n:b].zero_()
        self.slot_blocks[n:b].fill_(self.scratch_block)
        self.slot_offsets[n:b].zero_()
        self.tables[n:b].zero_()
        self.lens[n:b].fill_(1)
        graph, out = self.graphs[b]
        graph.replay()
        return out[:n]
