"""Continuous batching with no model: a fake runner whose tokens depend on its paged KV pool."""

from __future__ import annotations

import random

import pytest
from engine_fakes import FakeRunner, reference_generate
from hypothesis import given, settings
from hypothesis import strategies as st

from infertune.engine.block_manager import BlockManager
from infertune.engine.scheduler import (
    FinishReason,
    RequestRejectedError,
    Scheduler,
    SeqStatus,
    Sequence,
)


def make(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 1024,
) -> tuple[Scheduler, FakeRunner]:
    runner = FakeRunner(num_blocks, block_size)
    sched = Scheduler(
        BlockManager(num_blocks, block_size),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
    )
    return sched, runner


def run_to_completion(sched: Scheduler, runner: FakeRunner, max_steps: int = 10_000) -> int:
    steps = 0
    while sched.has_work:
        step = sched.schedule()
        assert step.inputs, "the scheduler made no progress"
        assert len(step.inputs) <= sched.max_num_seqs
        assert sum(len(i.token_ids) for i in step.inputs) <= sched.max_num_batched_tokens
        sched.update(step, runner.execute(step.inputs))
        steps += 1
        assert steps < max_steps
    return steps


def seqs(
    n: int, seed: int = 0, prompt_len: tuple[int, int] = (1, 30), out: int = 12
) -> list[Sequence]:
    rng = random.Random(seed)
    return [
        Sequence(
            seq_id=i,
            prompt_ids=[rng.randrange(97) for _ in range(rng.randint(*prompt_len))],
            max_tokens=out,
        )
        for i in range(n)
    ]


def test_batched_paged_run_matches_single_sequence_runs() -> None:
    sched, runner = make()
    batch = seqs(20)
    for s in batch:
        sched.add(s)
    run_to_completion(sched, runner)
    for s in batch:
        assert s.output_ids == reference_generate(s.prompt_ids, 12)
        assert s.finish_reason is FinishReason.LENGTH and s.status is SeqStatus.FINISHED
    assert sched.bm.num_free_blocks == sched.bm.num_blocks


def test_limits_are_respected_and_sequences_join_and_leave_each_step() -> None:
    sched, runner = make(max_num_seqs=3, max_num_batched_tokens=16)
    batch = seqs(7, prompt_len=(2, 6))
    for i, s in enumerate(batch):
        s.max_tokens = 2 + 3 * i  # staggered finishes free slots while others still decode
        sched.add(s)
    run_to_completion(sched, runner)
    for s in batch:
        assert s.output_ids == reference_generate(s.prompt_ids, s.max_tokens)
    widths = [len(b) for b in runner.batches]
    assert max(widths) == 3
    # Continuous batching: new sequences were admitted while others were still decoding.
    assert any(
        any(i.start_pos == 0 for i in b)
        and any(len(i.token_ids) == 1 and i.start_pos > 0 for i in b)
        for b in runner.batches
    )


def test_long_prompt_is_chunked_and_decodes_keep_running() -> None:
    sched, runner = make(num_blocks=128, max_num_batched_tokens=16)
    short = Sequence(0, [5, 6, 7], max_tokens=30)
    sched.add(short)
    sched.update(step := sched.schedule(), runner.execute(step.inputs))  # short is now decoding
    long = Sequence(1, list(range(90)), max_tokens=4)
    sched.add(long)
    long_chunks = 0
    while long.num_computed < len(long.prompt_ids):
        step = sched.schedule()
        ids = [i.seq_id for i in step.inputs]
        assert 0 in ids, "a decode step was stalled by the long prompt"
        assert sum(len(i.token_ids) for i in step.inputs) <= 16
        long_chunks += 1
        sched.update(step, runner.execute(step.inputs))
    assert long_chunks >= 90 // 15
    run_to_completion(sched, runner)
    assert short.output_ids == reference_generate(short.prompt_ids, 30)
    assert long.output_ids == reference_generate(long.prompt_ids, 4)


def test_blocks_running_out_preempt_the_newest_and_recompute_gives_same_tokens() -> None:
    # 12 blocks of 4 = 48 slots for 6 sequences that each grow to 8 + 24 = 32 positions.
    sched, runner = make(num_blocks=12, block_size=4, max_num_seqs=6)
    batch = seqs(6, seed=3, prompt_len=(8, 8), out=24)
    for s in batch:
        sched.add(s)
    run_to_completion(sched, runner)
    assert sched.num_preemptions > 0
    assert batch[0].num_preemptions == 0, "the oldest sequence must never be preempted"
    assert any(s.num_preemptions for s in batch[1:])
    for s in batch:
        assert s.output_ids == reference_generate(s.prompt_ids, 24)
    assert sched.bm.num_free_blocks == 12


@pytest.mark.parametrize("seed", range(8))
def test_random_workloads_match_reference(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    sched, runner = make(
        num_blocks=rng.randint(40, 120) // block_size + 8,
        block_size=block_size,
        max_num_seqs=rng.randint(1, 10),
        max_num_batched_tokens=rng.randint(1, 64),
    )
    batch = seqs(rng.randint(1, 15), seed=seed, prompt_len=(1, 25), out=rng.randint(1, 15))
    for s in batch:
        sched.add(s)
    run_to_completion(sched, runner)
    for s in batch:
        assert s.output_ids == reference_generate(s.prompt_ids, s.max_tokens)


def test_eos_stops_unless_ignored() -> None:
    prompt = [1, 2, 3]
    expected = reference_generate(prompt, 40)
    eos = expected[5]
    sched, runner = make()
    stop = Sequence(0, prompt, max_tokens=40, eos_token_ids=frozenset({eos}))
    keep = Sequence(1, prompt, max_tokens=40, eos_token_ids=frozenset({eos}), ignore_eos=True)
    sched.add(stop)
    sched.add(keep)
    run_to_completion(sched, runner)
    assert stop.output_ids == expected[: expected.index(eos) + 1]
    assert stop.finish_reason is FinishReason.STOP
    assert keep.output_ids == expected and keep.finish_reason is FinishReason.LENGTH


def test_abort_frees_blocks_wherever_the_sequence_is() -> None:
    sched, runner = make(max_num_seqs=1)
    a, b = Sequence(0, [1, 2, 3], max_tokens=50), Sequence(1, [4, 5], max_tokens=50)
    sched.add(a)
    sched.add(b)
    sched.update(step := sched.schedule(), runner.execute(step.inputs))
    assert a.status is SeqStatus.RUNNING and b.status is SeqStatus.WAITING
    assert sched.abort(1) is b and b.finish_reason is FinishReason.ABORT
    assert sched.abort(0) is a
    assert sched.abort(0) is None
    assert not sched.has_work and sched.bm.num_free_blocks == sched.bm.num_blocks


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "message"),
    [
        ([], 4, "prompt is empty"),
        ([1], 0, "max_tokens=0"),
        ([1] * 60, 10, "context length of 64"),
        ([1] * 30, 30, "KV cache capacity of 32"),
    ],
)
def test_requests_that_can_never_fit_are_rejected(
    prompt: list[int], max_tokens: int, message: str
) -> None:
    sched, _ = make(num_blocks=8, block_size=4, max_model_len=64)
    with pytest.raises(RequestRejectedError, match=message):
        sched.add(Sequence(0, prompt, max_tokens=max_tokens))
    assert not sched.has_work


def test_model_length_ends_a_sequence() -> None:
    sched, runner = make(max_model_len=20)
    s = Sequence(0, [1] * 10, max_tokens=10)
    sched.add(s)
    run_to_completion(sched, runner)
    assert len(s.output_ids) == 10 and s.num_tokens == 20


@settings(max_examples=60, deadline=None)
@given(
    block_size=st.sampled_from([1, 3, 4, 16]),
    num_blocks=st.integers(12, 60),
    max_num_seqs=st.integers(1, 8),
    budget=st.integers(1, 48),
    arrivals=st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 20), st.integers(1, 12), st.booleans()),
        min_size=1,
        max_size=12,
    ),
)
def test_arrivals_and_aborts_mid_run_never_corrupt_other_sequences(
    block_size: int,
    num_blocks: int,
    max_num_seqs: int,
    budget: int,
    arrivals: list[tuple[int, int, int, bool]],
) -> None:
    """Requests arrive at random steps, some are aborted later; survivors match the reference."""
    sched, runner = make(num_blocks, block_size, max_num_seqs, budget)
    pending = [
        (step, Sequence(i, [(i * 13 + j) % 97 for j in range(plen)], max_tokens=out), abort)
        for i, (step, plen, out, abort) in enumerate(arrivals)
        if plen + out <= num_blocks * block_size
    ]
    pending.sort(key=lambda t: t[0])
    seqs_ = [s for _, s, _ in pending]
    aborted: set[int] = set()
    step_no = 0
    while pending or sched.has_work:
        while pending and pending[0][0] <= step_no:
            _, seq, abort = pending.pop(0)
            sched.add(seq)
            if abort:
                aborted.add(seq.seq_id)
        if step_no % 5 == 4 and aborted:  # abort a marked one wherever it is now
            sched.abort(aborted.pop())
        step = sched.schedule()
        if step.inputs:
            sched.update(step, runner.execute(step.inputs))
        step_no += 1
        assert step_no < 5000
    for s in seqs_:
        assert s.status is SeqStatus.FINISHED
        if s.finish_reason is not FinishReason.ABORT:
            assert s.output_ids == reference_generate(s.prompt_ids, s.max_tokens)
        else:
            assert (
                s.output_ids == reference_generate(s.prompt_ids, s.max_tokens)[: len(s.output_ids)]
            )
    assert sched.bm.num_free_blocks == num_blocks
