"""Batched, paged, chunked and preempted execution give the tokens of a single-sequence run."""

from __future__ import annotations

import random

import pytest
from model_reference import generate_single, prompt_ids, tiny_model

from infertune.engine.runner import ModelRunner, SamplingParams, StepInput

N = 24
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def singles() -> list[list[int]]:
    runner = ModelRunner(tiny_model(), kv_block_size=16, num_kv_blocks=8)
    return [generate_single(runner, ids, N, list(range(8))) for ids in prompt_ids()]


def _tables(n_seqs: int, per_seq: int, num_blocks: int, seed: int) -> list[list[int]]:
    """Disjoint, shuffled (non-contiguous) block tables."""
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    return [ids[i * per_seq : (i + 1) * per_seq] for i in range(n_seqs)]


@pytest.mark.parametrize("block_size", [1, 4, 16, 32])
def test_batched_paged_decode_matches_single(
    block_size: int, singles: list[list[int]], fp32_path: str
) -> None:
    """On both fp32 paths (native kernels, torch ops) against single runs on the default one."""
    prompts = prompt_ids()
    per_seq = -(-(max(map(len, prompts)) + N + 1) // block_size)
    runner = ModelRunner(
        tiny_model(), kv_block_size=block_size, num_kv_blocks=per_seq * len(prompts) + 3
    )
    tables = _tables(len(prompts), per_seq, runner.num_kv_blocks, seed=block_size)
    first = runner.execute(
        [StepInput(i, list(p), 0, tables[i], True, GREEDY) for i, p in enumerate(prompts)]
    )
    outs: list[list[int]] = [[t] for t in first if t is not None]
    for step in range(N - 1):
        batch = [
            StepInput(i, [outs[i][-1]], len(p) + step, tables[i], True, GREEDY)
            for i, p in enumerate(prompts)
        ]
        for i, tok in enumerate(runner.execute(batch)):
            assert tok is not None
            outs[i].append(tok)
    assert outs == singles


def test_chunked_prefill_mixed_with_decode_matches_single(singles: list[list[int]]) -> None:
    """Prompts arrive in 3-token chunks while other sequences decode in the same steps."""
    prompts = prompt_ids()
    runner = ModelRunner(tiny_model(), kv_block_size=4, num_kv_blocks=200)
    tables = _tables(len(prompts), 20, 200, seed=7)
    done = {i: 0 for i in range(len(prompts))}  # prompt tokens already prefilled
    outs: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    while any(len(o) < N for o in outs.values()):
        batch: list[StepInput] = []
        for i, p in enumerate(prompts):
            if done[i] < len(p):
                chunk = list(p[done[i] : done[i] + 3])
                last = done[i] + len(chunk) == len(p)
                batch.append(StepInput(i, chunk, done[i], tables[i], last, GREEDY))
                done[i] += len(chunk)
            elif len(outs[i]) < N:
                pos = len(p) + len(outs[i]) - 1
                batch.append(StepInput(i, [outs[i][-1]], pos, tables[i], True, GREEDY))
            if i >= 2 * (len(batch) + 1):  # stagger arrivals: later prompts join later steps
                break
        for step, tok in zip(batch, runner.execute(batch), strict=True):
            if tok is not None:
                outs[step.seq_id].append(tok)
    assert [outs[i][:N] for i in range(len(prompts))] == singles


def test_preempted_and_recomputed_matches_single(singles: list[list[int]]) -> None:
    """Halfway through, drop the KV cache and re-prefill prompt + output into other blocks."""
    ids = prompt_ids()[0]
    runner = ModelRunner(tiny_model(), kv_block_size=8, num_kv_blocks=16)
    out = generate_single(runner, ids, N // 2, [0, 1, 2, 3, 4, 5])
    runner.kv_cache.zero_()  # the blocks were reused by others; nothing survives
    history = list(ids) + out
    table = [15, 9, 11, 7, 13, 8]
    nxt = runner.execute([StepInput(0, history, 0, table, True, GREEDY)])[0]
    while len(out) < N:
        assert nxt is not None
        out.append(nxt)
        nxt = runner.execute([StepInput(0, [nxt], len(history), table, True, GREEDY)])[0]
        history.append(out[-1])
    assert out == singles[0]


def test_seeded_sampling_is_reproducible_and_top_p_zero_is_greedy() -> None:
    runner = ModelRunner(tiny_model(), num_kv_blocks=8)
    ids = list(prompt_ids()[3])
    hot = SamplingParams(temperature=5.0, seed=42)

    def sample(params: SamplingParams) -> list[int | None]:
        return [runner.execute([StepInput(0, ids, 0, [0, 1], True, params)])[0] for _ in range(4)]

    draws = sample(hot)
    assert draws == sample(hot)
    assert len(set(sample(SamplingParams(temperature=5.0)))) > 1  # unseeded: varies
    greedy = runner.execute([StepInput(0, ids, 0, [0, 1], True, GREEDY)])[0]
    assert sample(SamplingParams(temperature=1.0, top_p=1e-6, seed=1)) == [greedy] * 4


def test_non_sampling_chunks_return_none_and_bad_tables_are_named() -> None:
    runner = ModelRunner(tiny_model(), kv_block_size=4, num_kv_blocks=8)
    assert runner.execute([StepInput(0, [1, 5, 9], 0, [0], False, GREEDY)]) == [None]
    with pytest.raises(ValueError, match="block_table has 1 blocks"):
        runner.execute([StepInput(3, [1, 5, 9, 4, 2], 0, [0], True, GREEDY)])
    runner.execute([StepInput(4, [1, 5, 9, 4], 0, [0], False, GREEDY)])
    with pytest.raises(ValueError, match=r"block ids outside \[0, 8\): \[0, 8\]"):
        runner.execute([StepInput(4, [7], 4, [0, 8], True, GREEDY)])  # a decode step
