"""Through the engine with the real tiny model: batching, paging, chunked prefill and preemption
change how tokens are computed, never which tokens come out (greedy, fp32)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from infertune.engine.engine import Engine  # noqa: E402
from infertune.engine.make_model import ensure_model  # noqa: E402
from infertune.engine.runner import ModelRunner  # noqa: E402
from infertune.engine.step import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [
    [1, *[(37 * i + 11 * j) % 4000 + 3 for j in range(n)]]
    for i, n in enumerate([3, 17, 40, 9, 64, 25])
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_model("tiny")


def run(engine: Engine, prompts: list[list[int]], concurrent: bool) -> list[list[int]]:
    async def one(prompt: list[int]) -> list[int]:
        out: list[int] = []
        async for event in engine.generate(
            prompt, max_tokens=NEW_TOKENS, sampling=GREEDY, ignore_eos=True
        ):
            out.extend(event.token_ids)
        return out

    async def main() -> list[list[int]]:
        if concurrent:
            return list(await asyncio.gather(*(one(p) for p in prompts)))
        return [await one(p) for p in prompts]

    engine.start()
    try:
        return asyncio.run(main())
    finally:
        engine.stop()


def test_preempted_chunked_batched_run_equals_single_sequence_runs(tiny: Path) -> None:
    alone = Engine(
        ModelRunner(tiny, kv_block_size=16, num_kv_blocks=64),
        max_num_seqs=1,
        max_num_batched_tokens=4096,
        max_model_len=4096,
    )
    expected = run(alone, PROMPTS, concurrent=False)
    # 24 blocks of 4 = 96 slots for six sequences that grow to 28..89 positions: the engine
    # must preempt; a budget of 8 tokens per step forces every prompt through chunked prefill.
    runner = ModelRunner(tiny, kv_block_size=4, num_kv_blocks=24)
    batches: list[list[int]] = []
    execute = runner.execute

    def spy(batch):  # type: ignore[no-untyped-def]
        batches.append([len(s.token_ids) for s in batch])
        return execute(batch)

    runner.execute = spy  # type: ignore[method-assign]
    busy = Engine(runner, max_num_seqs=6, max_num_batched_tokens=8, max_model_len=4096)
    got = run(busy, PROMPTS, concurrent=True)
    assert got == expected
    assert busy.stats.num_preemptions > 0
    assert max(len(b) for b in batches) > 1, "sequences were batched together"
    assert max(sum(b) for b in batches) <= 8
    assert busy.block_manager.num_free_blocks == 24
