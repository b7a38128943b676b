"""OpenAI log-probabilities from the built-in engine, over real HTTP with the real tiny model,
checked against the model's own teacher-forced scores (ModelRunner.score)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytest.importorskip("torch")
import torch
from tokenizers import Tokenizer

from infertune.engine.core_client import RemoteEngine
from infertune.engine.engine import Engine, EngineFrontend
from infertune.engine.make_model import ensure_model
from infertune.engine.runner import ModelRunner
from infertune.engine.serve_config import ServeConfig
from infertune.engine.server import EngineServer, start_server

PROMPT = [1, *range(40, 77)]  # 38 tokens: several prefill chunks of 16 below


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_model("tiny")


@pytest.fixture(scope="module")
def runner(tiny: Path) -> ModelRunner:
    return ModelRunner(tiny, kv_block_size=16, num_kv_blocks=256)


@pytest.fixture(scope="module")
def reference(tiny: Path) -> Any:
    """log-softmax at every position of PROMPT, teacher-forced in one pass (no server)."""
    scorer = ModelRunner(tiny, kv_block_size=16, num_kv_blocks=8)
    return torch.log_softmax(scorer.score(PROMPT).float(), dim=-1)


def serve(
    runner: ModelRunner,
    tiny: Path,
    body: Callable[[Callable[..., Awaitable[Any]]], Awaitable[None]],
    placement: str = "thread",
    **engine_kw: Any,
) -> None:
    engine: EngineFrontend
    if placement == "thread":
        engine = Engine(runner, max_model_len=4096, eos_token_ids=(2,), **engine_kw)
    else:
        budget = 256 * runner.kv_bytes_per_block()
        config = ServeConfig(model=str(tiny), quantization="fp32", kv_cache_memory=budget)
        engine = RemoteEngine(config, tiny)
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    server = EngineServer(engine, tok, model_name="tiny", model_dir=tiny)

    async def main() -> None:
        engine.start()
        app_runner, port = await start_server(server, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as session:

                async def post(path: str, req: dict[str, Any], status: int = 200) -> Any:
                    async with session.post(url + path, json=req) as resp:
                        assert resp.status == status, await resp.text()
                        if req.get("stream"):
                            lines = [ln.decode().strip() async for ln in resp.content]
                            return [
                                json.loads(ln[6:])
                                for ln in lines
                                if ln.startswith("data: ") and ln != "data: [DONE]"
                            ]
                        return await resp.json()

                await body(post)
        finally:
            await app_runner.cleanup()

    try:
        asyncio.run(main())
    finally:
        engine.stop()


def _token_id(key: str) -> int:
    assert key.startswith("token_id:"), key
    return int(key.removeprefix("token_id:"))


@pytest.mark.parametrize(("placement", "chunk"), [("thread", 16), ("core-process", 512)])
def test_echo_returns_the_prompts_teacher_forced_logprobs(
    runner: ModelRunner, tiny: Path, reference: Any, placement: str, chunk: int
) -> None:
    """echo + max_tokens 0 (what a scorer sends vLLM): every prompt token's log-probability and
    top-k equal the model's own, also when the prompt is prefilled in several chunks."""

    async def body(post: Callable[..., Awaitable[Any]]) -> None:
        req = {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 5}
        out = await post("/v1/completions", {**req, "return_tokens_as_token_ids": True})
        choice = out["choices"][0]
        lp = choice["logprobs"]
        assert [_token_id(t) for t in lp["tokens"]] == PROMPT  # the prompt only: no new token
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert out["usage"]["completion_tokens"] == 0
        for p in range(1, len(PROMPT)):
            want = reference[p - 1]
            assert lp["token_logprobs"][p] == pytest.approx(float(want[PROMPT[p]]), abs=1e-4)
            top = {_token_id(k): v for k, v in lp["top_logprobs"][p].items()}
            best = want.topk(5)
            for t, v in zip(best.indices.tolist(), best.values.tolist(), strict=True):
                assert top[t] == pytest.approx(v, abs=1e-4)
        assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])

    serve(runner, tiny, body, placement, **({"max_num_batched_tokens": chunk} if chunk else {}))


def test_generated_tokens_carry_their_logprobs_streamed_or_not(
    runner: ModelRunner, tiny: Path
) -> None:
    async def body(post: Callable[..., Awaitable[Any]]) -> None:
        req = {"prompt": PROMPT[:10], "max_tokens": 6, "temperature": 0, "logprobs": 3}
        # Token ids as keys: two ids can decode to the same text (a lone byte reads U+FFFD).
        req["return_tokens_as_token_ids"] = True
        full = await post("/v1/completions", req)
        lp = full["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == 6  # each decoded alone, as vLLM does
        for token, value, top in zip(
            lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
        ):
            assert value <= 0 and top[token] == value
            assert value == pytest.approx(max(top.values()))  # greedy: the most likely token
        chunks = await post("/v1/completions", {**req, "stream": True})
        streamed = [c["choices"][0]["logprobs"] for c in chunks]
        assert [v for s in streamed for v in s["token_logprobs"]] == pytest.approx(
            lp["token_logprobs"], abs=1e-5
        )
        chat = await post(
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": 2,
            },
        )
        content = chat["choices"][0]["logprobs"]["content"]
        assert len(content) == 4 and all(len(c["top_logprobs"]) == 2 for c in content)
        plain = await post("/v1/completions", {"prompt": PROMPT[:10], "max_tokens": 2})
        assert plain["choices"][0]["logprobs"] is None  # not asked, not computed
        await post("/v1/completions", {"prompt": "x", "max_tokens": 0}, status=400)
        await post("/v1/completions", {"prompt": "x", "logprobs": -1}, status=400)

    serve(runner, tiny, body)


def test_a_step_without_logprobs_computes_none(runner: ModelRunner) -> None:
    """The hot path: a batch that asks for nothing leaves nothing to take."""
    from infertune.engine.step import StepInput

    runner.execute([StepInput(0, PROMPT[:5], 0, [0], True)])
    assert runner.take_logprobs() == {}
    runner.execute([StepInput(0, PROMPT[:5], 0, [0], True, logprobs=2, score_ids=PROMPT[1:5])])
    got = runner.take_logprobs()[0]
    assert [t.position for t in got.prompt] == [1, 2, 3, 4] and got.sampled is not None
    assert runner.take_logprobs() == {}


def test_prompt_logprobs_survive_preemption_once_each(tiny: Path) -> None:
    """A KV pool too small for every request preempts some mid-prompt or mid-decode; each
    request still gets every prompt position's log-probability once, equal to the model's."""
    runner = ModelRunner(tiny, kv_block_size=4, num_kv_blocks=24)
    engine = Engine(runner, max_num_seqs=6, max_num_batched_tokens=8, max_model_len=4096)
    scorer = ModelRunner(tiny, kv_block_size=16, num_kv_blocks=8)
    prompts = [[1, *range(100 + 9 * i, 118 + 9 * i)] for i in range(6)]  # 19 tokens each

    async def one(prompt: list[int]) -> list[Any]:
        _, queue = engine.add_request(prompt, max_tokens=16, logprobs=3, prompt_logprobs=True)
        events = [await queue.get()]
        while not events[-1].finished:
            events.append(await queue.get())
        return events

    async def main() -> list[list[Any]]:
        return await asyncio.gather(*(one(p) for p in prompts))

    engine.start()
    try:
        results = asyncio.run(main())
    finally:
        engine.stop()
    assert engine.stats.num_preemptions > 0, "the pool was sized to force preemption"
    for prompt, events in zip(prompts, results, strict=True):
        sent = [e.prompt_logprobs for e in events if e.prompt_logprobs is not None]
        assert len(sent) == 1  # on the first token's event only
        got = sent[0]
        assert [t.position for t in got] == list(range(1, len(prompt)))
        want = torch.log_softmax(scorer.score(prompt).float(), dim=-1)
        for t in got:
            assert t.token_id == prompt[t.position]
            assert t.logprob == pytest.approx(float(want[t.position - 1, t.token_id]), abs=1e-4)
        outputs = [e for e in events if e.token_ids]
        assert all(e.logprobs and e.logprobs[0].token_id == e.token_ids[0] for e in outputs)
