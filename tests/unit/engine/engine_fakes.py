"""A torch-free stand-in for ModelRunner whose tokens depend on what is really in its KV pool.

The fake keeps a pool of ``num_kv_blocks`` x ``block_size`` slots. ``execute`` writes each input
token into the slot its block table names, then samples the next token from the context read
back through the block table. A wrong block table, a wrong ``start_pos``, a block shared by two
live sequences or a position whose KV was never written all change (or break) the tokens, so
matching :func:`reference_generate` is a real check of the scheduler's paging.
"""

from __future__ import annotations

import time

from infertune.engine.step import StepInput

VOCAB = 97


def next_token(context: list[int]) -> int:
    acc = len(context)
    for i, tok in enumerate(context):
        acc = (acc * 1_000_003 + (i + 1) * (tok + 7)) % 2_147_483_647
    return acc % VOCAB


def reference_generate(
    prompt: list[int], max_tokens: int, eos: int | None = None, ignore_eos: bool = False
) -> list[int]:
    """What one sequence alone produces, with no paging at all."""
    ctx = list(prompt)
    out: list[int] = []
    while len(out) < max_tokens:
        tok = next_token(ctx)
        out.append(tok)
        ctx.append(tok)
        if eos is not None and tok == eos and not ignore_eos:
            break
    return out


class FakeRunner:
    def __init__(self, num_kv_blocks: int, block_size: int, step_delay: float = 0.0) -> None:
        self.step_delay = step_delay  # seconds per execute, like a real forward pass
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.kv: list[list[int | None]] = [[None] * block_size for _ in range(num_kv_blocks)]
        self.batches: list[list[StepInput]] = []
        self.fail_next = False

    def execute(self, batch: list[StepInput]) -> list[int | None]:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected runner failure")
        self.batches.append(batch)
        if self.step_delay:
            time.sleep(self.step_delay)
        bs = self.block_size
        out: list[int | None] = []
        for step in batch:
            for i, tok in enumerate(step.token_ids):
                pos = step.start_pos + i
                self.kv[step.block_table[pos // bs]][pos % bs] = tok
            if not step.sample:
                out.append(None)
                continue
            end = step.start_pos + len(step.token_ids)
            ctx = [self.kv[step.block_table[p // bs]][p % bs] for p in range(end)]
            assert all(t is not None for t in ctx), f"seq {step.seq_id} reads unwritten KV"
            out.append(next_token([t for t in ctx if t is not None]))
        return out
