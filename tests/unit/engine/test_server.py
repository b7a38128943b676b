"""The OpenAI-compatible server over real HTTP with the real tiny model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytest.importorskip("torch")
from tokenizers import Tokenizer

from infertune.engine.core_client import RemoteEngine
from infertune.engine.engine import Engine, EngineFrontend
from infertune.engine.make_model import ensure_model
from infertune.engine.runner import ModelRunner
from infertune.engine.serve_config import ServeConfig
from infertune.engine.server import EngineServer, start_server

Client = Callable[..., Awaitable[Any]]


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_model("tiny")


@pytest.fixture(scope="module")
def runner(tiny: Path) -> ModelRunner:
    return ModelRunner(tiny, kv_block_size=16, num_kv_blocks=256)


# Where the engine loop runs: a thread of the server (tests can look inside its scheduler), or
# the engine-core process `infertune serve` uses (only its gauges come back).
PLACEMENTS = ["thread", "core-process"]


def serve(
    runner: ModelRunner,
    tiny: Path,
    body: Callable[[str, EngineServer], Awaitable[None]],
    placement: str = "thread",
    **engine_kw: Any,
) -> None:
    """Run ``body(base_url, server)`` against a live server on a free port."""
    settings = {"max_model_len": 4096, "eos_token_ids": (2,), **engine_kw}
    engine: EngineFrontend
    if placement == "thread":
        engine = Engine(runner, **settings)
    else:
        # The same engine from flags: 256 blocks of 16 tokens, the model's 4096 context and EOS.
        budget = 256 * runner.kv_bytes_per_block()
        config = ServeConfig(
            model=str(tiny), quantization="fp32", kv_cache_memory=budget, **engine_kw
        )
        engine = RemoteEngine(config, tiny)
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    server = EngineServer(engine, tok, model_name="tiny", model_dir=tiny)

    async def main() -> None:
        engine.start()
        app_runner, port = await start_server(server, "127.0.0.1", 0)
        try:
            await body(f"http://127.0.0.1:{port}", server)
        finally:
            await app_runner.cleanup()

    try:
        asyncio.run(main())
    finally:
        engine.stop()


async def drained(engine: EngineFrontend) -> bool:
    """Every sequence gone and every KV block free, within a few seconds."""
    for _ in range(300):
        if isinstance(engine, Engine):
            done = engine.block_manager.num_free_blocks == 256 and not engine.scheduler.has_work
        else:  # the core process reports its gauges after every step
            st = engine.stats
            done = st.kv_usage == 0 and st.num_running == 0 and st.num_waiting == 0
        if done:
            return True
        await asyncio.sleep(0.02)
    return False


async def sse(resp: aiohttp.ClientResponse) -> list[Any]:
    events: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_completions_stream_and_not_agree_and_report_usage(runner: ModelRunner, tiny: Path) -> None:
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    prompt = "The quick brown fox jumps over the lazy dog"
    n_prompt = len(tok.encode(prompt).ids)

    async def body(url: str, _: EngineServer) -> None:
        req = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0,
               "ignore_eos": True}  # fmt: skip
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/v1/completions", json=req) as r:
                assert r.status == 200
                full = await r.json()
            stream_req = req | {"stream": True, "stream_options": {"include_usage": True}}
            async with s.post(f"{url}/v1/completions", json=stream_req) as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/event-stream")
                events = await sse(r)
        assert full["object"] == "text_completion"
        assert full["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 12,
                                 "total_tokens": n_prompt + 12}  # fmt: skip
        assert full["choices"][0]["finish_reason"] == "length"
        assert events[-1] == "[DONE]"
        usage = events[-2]
        assert usage["choices"] == [] and usage["usage"] == full["usage"]
        chunks = events[:-2]
        assert len(chunks) == 12, "one chunk per generated token"
        assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 11 + ["length"]

    serve(runner, tiny, body)


def test_token_id_prompts_max_tokens_seed_and_chat(runner: ModelRunner, tiny: Path) -> None:
    async def body(url: str, _: EngineServer) -> None:
        async with aiohttp.ClientSession() as s:

            async def post(path: str, req: dict[str, Any]) -> Any:
                async with s.post(f"{url}{path}", json=req) as r:
                    assert r.status == 200, await r.text()
                    return await r.json()

            ids = await post("/v1/completions", {"prompt": [1, 50, 60, 70], "max_tokens": 5,
                                                 "ignore_eos": True})  # fmt: skip
            assert ids["usage"]["prompt_tokens"] == 4
            assert ids["usage"]["completion_tokens"] == 5
            sampled = {"prompt": "hello", "max_tokens": 16, "temperature": 0.9, "seed": 7,
                       "ignore_eos": True}  # fmt: skip
            a = await post("/v1/completions", sampled)
            b = await post("/v1/completions", sampled)
            assert a["choices"][0]["text"] == b["choices"][0]["text"]
            chat = await post(
                "/v1/chat/completions",
                {
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 6,
                    "ignore_eos": True,
                },
            )
            assert chat["object"] == "chat.completion"
            assert chat["choices"][0]["message"]["role"] == "assistant"
            assert chat["usage"]["completion_tokens"] == 6
            req = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                   "stream": True}  # fmt: skip
            async with s.post(f"{url}/v1/chat/completions", json=req) as r:
                events = await sse(r)
            assert events[0]["object"] == "chat.completion.chunk"
            assert events[0]["choices"][0]["delta"]["role"] == "assistant"
            assert events[-1] == "[DONE]"
            async with s.get(f"{url}/v1/models") as r:
                models = await r.json()
            assert models["data"][0]["id"] == "tiny"
            async with s.get(f"{url}/health") as r:
                assert r.status == 200

    serve(runner, tiny, body)


@pytest.mark.parametrize(
    ("path", "payload", "status", "fragment"),
    [
        ("/v1/completions", "not json", 400, "not valid JSON"),
        ("/v1/completions", {"max_tokens": 3}, 400, "prompt must be"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens must be"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, 400, "context length of 4096"),
        ("/v1/completions", {"prompt": "x", "temperature": 9}, 400, "temperature=9"),
        ("/v1/completions", {"prompt": "x", "model": "other"}, 404, "`other` does not exist"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages must be"),
    ],
)
def test_bad_requests_get_clear_errors(
    runner: ModelRunner, tiny: Path, path: str, payload: Any, status: int, fragment: str
) -> None:
    async def body(url: str, _: EngineServer) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        async with aiohttp.ClientSession() as s, s.post(f"{url}{path}", data=data) as r:
            assert r.status == status
            assert fragment in (await r.json())["error"]["message"]

    serve(runner, tiny, body)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_overload_gets_503_with_retry_after_and_the_server_survives(
    runner: ModelRunner, tiny: Path, placement: str
) -> None:
    async def body(url: str, _: EngineServer) -> None:
        req = {"prompt": "overload", "max_tokens": 40, "ignore_eos": True}
        async with aiohttp.ClientSession() as s:

            async def one() -> tuple[int, str | None]:
                async with s.post(f"{url}/v1/completions", json=req) as r:
                    await r.read()
                    return r.status, r.headers.get("Retry-After")

            results = await asyncio.gather(*(one() for _ in range(24)))
            statuses = [st for st, _ in results]
            assert statuses.count(200) >= 2  # at most two wait; whatever was admitted finished
            assert statuses.count(503) >= 1
            assert set(statuses) == {200, 503}
            assert all(ra == "1" for st, ra in results if st == 503)
            async with s.post(f"{url}/v1/completions", json=req) as r:
                assert r.status == 200

    serve(runner, tiny, body, placement, max_num_seqs=1, max_waiting=2)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_metrics_use_vllm_names_and_count_requests(
    runner: ModelRunner, tiny: Path, placement: str
) -> None:
    async def body(url: str, server: EngineServer) -> None:
        req = {"prompt": "metrics", "max_tokens": 4, "ignore_eos": True, "stream": True}
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                async with s.post(f"{url}/v1/completions", json=req) as r:
                    await sse(r)
            async with s.get(f"{url}/metrics") as r:
                assert r.status == 200
                text = await r.text()
        lines = text.splitlines()

        def value(sample: str) -> float:
            hits = [
                ln for ln in lines if ln.startswith(sample + "{") or ln.startswith(sample + " ")
            ]
            assert hits, f"{sample} is missing from /metrics"
            return float(hits[0].rsplit(" ", 1)[1])

        assert value("vllm:time_to_first_token_seconds_count") == 3
        assert value("vllm:inter_token_latency_seconds_count") == 9
        assert value("vllm:time_per_output_token_seconds_count") == 9
        assert value("vllm:e2e_request_latency_seconds_count") == 3
        assert value("vllm:request_generation_tokens_sum") == 12
        assert value("vllm:generation_tokens_total") == 12
        assert value("vllm:prompt_tokens_total") == value("vllm:request_prompt_tokens_sum")
        assert 'vllm:request_success_total{finished_reason="length",model_name="tiny"} 3.0' in text
        for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
            assert value(f"vllm:{gauge}") == 0
        assert 'vllm:time_to_first_token_seconds_bucket{le="0.005"' in text  # ms-level buckets

    serve(runner, tiny, body, placement)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_client_disconnect_mid_stream_frees_the_sequence(
    runner: ModelRunner, tiny: Path, placement: str
) -> None:
    async def body(url: str, server: EngineServer) -> None:
        req = {"prompt": "bye", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        async with aiohttp.ClientSession() as s:
            r = await s.post(f"{url}/v1/completions", json=req)
            await r.content.readline()  # the first token arrived: it is running
            assert server.engine.stats.num_running == 1
            r.close()  # hang up
        assert await drained(server.engine)

    serve(runner, tiny, body, placement)


def _serve_cli(tiny: Path) -> tuple[subprocess.Popen[str], str]:
    """``infertune serve`` on the tiny model; the process and its URL once it printed ready."""
    argv = ["serve", "--model", str(tiny), "--port", "0", "--kv-cache-memory", "64MiB",
            "--max-num-seqs", "4"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "infertune.engine.cli", *argv],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("infertune engine ready on http://127.0.0.1:"):
        proc.kill()
        proc.wait()
        raise AssertionError(line)
    return proc, line.rsplit(" ", 1)[1]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _core_pid(server_pid: int) -> int:
    """The engine-core process the server started."""
    return next(
        c
        for c in _children(server_pid)
        if b"infertune.engine.core_process" in Path(f"/proc/{c}/cmdline").read_bytes()
    )


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    # Gone, or a zombie nobody reaped yet (the state follows the "(comm)" field).
    return not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z"


def test_cli_prints_ready_serves_and_exits_cleanly_on_sigterm(tiny: Path) -> None:
    proc, url = _serve_cli(tiny)
    try:
        runner = _core_pid(proc.pid)

        async def check() -> Any:
            async with aiohttp.ClientSession() as s:
                req = {"prompt": "hi", "max_tokens": 3}
                async with s.post(f"{url}/v1/completions", json=req) as r:
                    return await r.json()

        assert asyncio.run(check())["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0  # promptly: a rolling restart waits for it
        assert _gone(runner), "the model-runner process outlived the server"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_server_dies_by_the_signal_that_killed_its_idle_runner(tiny: Path) -> None:
    """A runner OOM-killed while no request is running must not leave a server that answers
    /health with nothing behind it: the server ends too, by the same signal, so the supervisor
    (a trial, a kubelet) sees why."""
    proc, _ = _serve_cli(tiny)
    try:
        os.kill(_core_pid(proc.pid), signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_errors_name_the_flag(tiny: Path) -> None:
    from infertune.engine.cli import serve_main

    with pytest.raises(SystemExit):
        serve_main(["--model", str(tiny), "--kv-cache-memory", "lots"])
    with pytest.raises(SystemExit, match="--gpu-memory-utilization applies to CUDA"):
        serve_main(["--model", str(tiny), "--gpu-memory-utilization", "0.5", "--device", "cpu"])
    assert serve_main(["--model", str(tiny), "--cuda-graph", "--device", "cpu"]) == 2


def test_a_bad_model_path_is_named_and_leaves_no_engine_core_behind(tmp_path: Path) -> None:
    """The engine core is spawned before the model path is checked (it imports torch while the
    server starts): a serve that then fails must not leave it running."""
    marker = f"INFERTUNE_TEST_MARK={tmp_path.name}"
    proc = subprocess.run(
        [sys.executable, "-m", "infertune.engine.cli", "serve", "--model", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"INFERTUNE_TEST_MARK": tmp_path.name},
    )
    assert proc.returncode != 0
    assert f"--model '{tmp_path / 'none'}' is neither a checkpoint directory" in proc.stderr

    def ours(pid: str) -> bool:
        try:
            return marker.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            return False

    left = [p for p in os.listdir("/proc") if p.isdigit() and ours(p)]
    assert all(_gone(int(p)) for p in left), f"engine-core processes left behind: {left}"


def test_incremental_detokenizer_streams_exactly_the_full_text(tiny: Path) -> None:
    from infertune.engine.protocol import IncrementalDetokenizer

    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    text = "Hello world, héllo 東京! multi-byte é and spaces   end"
    ids = tok.encode(text).ids[1:]  # without <s>
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add([i]) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == tok.decode(ids)
    assert not any("\ufffd" in d for d in deltas), "a half character was streamed"


def test_make_model_cli_reuses_a_matching_checkpoint(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from infertune.engine.cli import make_model_main

    before = (tiny / "model.safetensors").stat().st_mtime_ns
    assert make_model_main([str(tiny), "--size", "tiny"]) == 0
    assert capsys.readouterr().out.strip() == str(tiny)
    assert (tiny / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_mixed_abandoned_and_overloaded_traffic_leaves_a_clean_engine(
    runner: ModelRunner, tiny: Path, placement: str
) -> None:
    async def body(url: str, server: EngineServer) -> None:
        async with aiohttp.ClientSession() as s:

            async def one(i: int) -> int:
                req = {"prompt": f"client {i}", "max_tokens": 30, "ignore_eos": True,
                       "stream": i % 2 == 0}  # fmt: skip
                async with s.post(f"{url}/v1/completions", json=req) as r:
                    if r.status != 200:
                        return r.status
                    if i % 3 == 0:  # hang up after the first line
                        await r.content.readline()
                        r.close()
                        return 499
                    await r.read()
                    return 200

            statuses = await asyncio.gather(*(one(i) for i in range(30)))
            assert {200, 499} <= set(statuses) <= {200, 499, 503}
            assert await drained(server.engine)
            async with s.post(f"{url}/v1/completions", json={"prompt": "ok", "max_tokens": 2}) as r:
                assert r.status == 200

    serve(runner, tiny, body, placement, max_num_seqs=4, max_waiting=8)
