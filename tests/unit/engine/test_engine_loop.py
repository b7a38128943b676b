"""The engine with a fake runner, on its thread and by step() alone: concurrency, preemption,
overload, failures, aborts."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from engine_fakes import FakeRunner, reference_generate

from infertune.engine.engine import Engine, EngineOverloadedError, TokenEvent
from infertune.engine.scheduler import RequestRejectedError, Sequence
from infertune.engine.step import StepInput


async def collect(engine: Engine, prompt: list[int], max_tokens: int) -> list[TokenEvent]:
    return [e async for e in engine.generate(prompt, max_tokens=max_tokens)]


def test_concurrent_requests_with_preemption_and_chunking_match_reference() -> None:
    runner = FakeRunner(num_kv_blocks=16, block_size=4)
    engine = Engine(runner, max_num_seqs=8, max_num_batched_tokens=7, max_model_len=256)
    prompts = [[(i * 7 + j) % 97 for j in range(3 + 3 * i)] for i in range(10)]

    async def main() -> list[list[TokenEvent]]:
        return await asyncio.gather(*(collect(engine, p, 20) for p in prompts))

    engine.start()
    try:
        results = asyncio.run(main())
    finally:
        engine.stop()
    for prompt, events in zip(prompts, results, strict=True):
        tokens = [t for e in events for t in e.token_ids]
        assert tokens == reference_generate(prompt, 20)
        assert events[-1].finished and events[-1].finish_reason == "length"
        assert all(not e.finished for e in events[:-1])
        times = [e.time for e in events]
        assert times == sorted(times)
    assert engine.stats.num_preemptions > 0, "the pool was sized to force preemption"
    assert engine.block_manager.num_free_blocks == 16
    assert max(sum(len(i.token_ids) for i in b) for b in runner.batches) <= 7


class GatedRunner(FakeRunner):
    """Blocks inside ``execute`` until released, so requests pile up in the queue."""

    def __init__(self) -> None:
        super().__init__(num_kv_blocks=64, block_size=4)
        self.gate = threading.Event()

    def execute(self, batch: list[StepInput]) -> list[int | None]:
        self.gate.wait(timeout=10)
        return super().execute(batch)


def test_full_waiting_queue_is_refused_then_everything_admitted_completes() -> None:
    runner = GatedRunner()
    engine = Engine(runner, max_num_seqs=1, max_model_len=128, max_waiting=2)

    async def main() -> tuple[int, list[list[TokenEvent]]]:
        tasks = [asyncio.create_task(collect(engine, [1, 2, 3], 3))]
        await asyncio.sleep(0.2)  # the first is now running (blocked in execute)
        refused = 0
        for _ in range(6):
            try:
                tasks.append(asyncio.create_task(collect(engine, [4, 5], 3)))
                await asyncio.sleep(0.05)
                if tasks[-1].done() and isinstance(tasks[-1].exception(), EngineOverloadedError):
                    tasks.pop()
                    refused += 1
            except EngineOverloadedError:
                refused += 1
        runner.gate.set()
        return refused, await asyncio.gather(*tasks)

    engine.start()
    try:
        refused, results = asyncio.run(main())
    finally:
        engine.stop()
    assert refused == 4  # one running, two waiting, the rest refused
    assert len(results) == 3
    for events in results:
        assert events[-1].finish_reason == "length" and len(events) == 3


def test_runner_failure_fails_its_requests_and_the_engine_keeps_serving() -> None:
    runner = FakeRunner(num_kv_blocks=32, block_size=4)
    engine = Engine(runner, max_model_len=128)
    runner.fail_next = True

    async def main() -> tuple[list[TokenEvent], list[TokenEvent]]:
        failed = await collect(engine, [1, 2, 3], 5)
        ok = await collect(engine, [1, 2, 3], 5)
        return failed, ok

    engine.start()
    try:
        failed, ok = asyncio.run(main())
    finally:
        engine.stop()
    assert failed[-1].finished and failed[-1].error == "injected runner failure"
    assert [t for e in ok for t in e.token_ids] == reference_generate([1, 2, 3], 5)
    assert engine.block_manager.num_free_blocks == 32


def test_leaving_early_aborts_and_frees_the_sequence() -> None:
    runner = FakeRunner(num_kv_blocks=32, block_size=4, step_delay=0.005)
    engine = Engine(runner, max_model_len=120)

    async def main() -> int:
        got = 0
        async with contextlib.aclosing(engine.generate([1, 2, 3], max_tokens=100)) as events:
            async for _ in events:
                got += 1
                if got == 3:
                    break
        for _ in range(100):  # the abort is applied by the engine thread between steps
            if engine.block_manager.num_free_blocks == 32 and not engine.scheduler.has_work:
                break
            await asyncio.sleep(0.01)
        return got

    engine.start()
    try:
        assert asyncio.run(main()) == 3
    finally:
        engine.stop()
    assert engine.block_manager.num_free_blocks == 32
    assert sum(1 for b in runner.batches for i in b if i.seq_id == 0) < 100


def test_impossible_requests_are_rejected_before_queueing() -> None:
    engine = Engine(FakeRunner(num_kv_blocks=4, block_size=4), max_model_len=1000)

    async def main() -> None:
        with pytest.raises(RequestRejectedError, match="KV cache capacity of 16"):
            engine.add_request([1] * 10, max_tokens=10)

    asyncio.run(main())
    assert not engine.scheduler.has_work


def test_warmup_runs_before_start_only() -> None:
    runner = FakeRunner(num_kv_blocks=4, block_size=4)
    engine = Engine(runner, max_model_len=64)
    engine.warmup()
    assert [len(b[0].token_ids) for b in runner.batches] == [8, 1]
    engine.start()
    try:
        with pytest.raises(RuntimeError, match="before start"):
            engine.warmup()
    finally:
        engine.stop()


def test_step_alone_serves_requests_as_the_core_process_drives_it() -> None:
    """No thread, no event loop: submit, then step() until done, as the engine core's loop does.
    Each step's events come back from step(), with the gauges already counting them."""
    runner = FakeRunner(num_kv_blocks=16, block_size=4)
    engine = Engine(runner, max_num_seqs=4, max_num_batched_tokens=7, max_model_len=256)
    prompts = [[(i * 5 + j) % 97 for j in range(2 + 4 * i)] for i in range(5)]
    for i, prompt in enumerate(prompts):
        engine.submit(Sequence(seq_id=i, prompt_ids=prompt, max_tokens=12), arrival=0.0)
    engine.submit(Sequence(seq_id=99, prompt_ids=[1, 2], max_tokens=50), arrival=0.0)
    engine.abort(99)
    tokens: dict[int, list[int]] = {}
    finished: dict[int, str | None] = {}
    while engine.has_work:
        for req, event in engine.step():
            assert req.loop is None and req.queue is None
            tokens.setdefault(req.seq.seq_id, []).extend(event.token_ids)
            if event.finished:
                finished[req.seq.seq_id] = event.finish_reason
                # step() updated the gauges before it returned the finishing event
                assert req.seq not in engine.scheduler.running
    for i, prompt in enumerate(prompts):
        assert tokens[i] == reference_generate(prompt, 12) and finished[i] == "length"
    assert finished[99] == "abort" and tokens[99] == []
    assert engine.stats.num_running == engine.stats.num_waiting == 0 and engine.stats.num_steps
    assert engine.block_manager.num_free_blocks == 16 and engine.step() == []
    assert engine.fail_all("stopped") == []
