"""The OpenAI-compatible HTTP server (aiohttp) in front of :class:`~infertune.engine.engine.Engine`.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed as server-sent
events or not), ``GET /v1/models``, ``GET /health`` and ``GET /metrics`` (Prometheus text, vLLM's
metric names). A full waiting queue is answered with 503 and ``Retry-After`` instead of queueing
without bound; requests that can never fit are answered with 400.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from tokenizers import Tokenizer

from infertune.engine.chat_template import load_chat_template
from infertune.engine.engine import EngineFrontend, EngineOverloadedError, TokenEvent
from infertune.engine.logprobs import TokenText, chat_logprobs, completion_logprobs
from infertune.engine.metrics import CONTENT_TYPE, EngineMetrics
from infertune.engine.protocol import (
    BadRequestError,
    GenerationRequest,
    IncrementalDetokenizer,
    parse_request,
)
from infertune.engine.scheduler import RequestRejectedError
from infertune.engine.step import TokenLogprob

__all__ = ["EngineServer", "start_server"]

RETRY_AFTER_S = 1


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return web.json_response(body, status=status, headers=headers)


@dataclass
class _Stream:
    """One request's progress as the HTTP side sees it."""

    request: GenerationRequest
    seq_id: int
    queue: asyncio.Queue[TokenEvent]
    arrival: float
    detok: IncrementalDetokenizer
    text: str = ""
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False
    queue_time: float | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # only when the request asked
    prompt_logprobs: list[TokenLogprob] | None = None

    @property
    def echo_only(self) -> bool:
        """``echo`` with ``max_tokens: 0``: the engine makes one token, the client gets none."""
        return self.request.echo and self.request.max_tokens == 0

    def take(self, event: TokenEvent) -> str:
        """Apply one engine event; the new text it contributes (stop strings honoured)."""
        if event.queue_time is not None:
            self.queue_time = event.queue_time
        if event.logprobs:
            self.logprobs.extend(event.logprobs)
        if event.prompt_logprobs is not None:
            self.prompt_logprobs = event.prompt_logprobs
        self.token_times.extend([event.time] * len(event.token_ids))
        delta = self.detok.add(event.token_ids) if event.token_ids else ""
        if event.finished:
            delta += self.detok.flush()
            self.done = True
            self.finish_reason = event.finish_reason
            self.error = event.error
        for stop in self.request.stop:
            text = self.text + delta
            at = text.find(stop, max(0, len(self.text) - len(stop) + 1))
            if at >= 0:
                delta = text[len(self.text) : at] if at >= len(self.text) else ""
                self.done = True
                self.finish_reason = "stop"
                break
        self.text += delta
        return delta

    def usage(self) -> dict[str, int]:
        n_prompt, n_out = len(self.request.prompt_ids), len(self.token_times)
        n_out = 0 if self.echo_only else n_out
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out,
        }


class EngineServer:
    def __init__(
        self,
        engine: EngineFrontend,
        tokenizer: Tokenizer,
        *,
        model_name: str,
        model_dir: Path | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_dir = model_dir
        # The checkpoint's own chat template (chat_template.jinja / tokenizer_config.json).
        self.chat_template = load_chat_template(model_dir) if model_dir is not None else None
        self.metrics = EngineMetrics(model_name, engine.stats)
        self.created = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_handler)
        return app

    # ---- simple routes ------------------------------------------------------------------------
    async def health(self, _: web.Request) -> web.Response:
        if not self.engine.is_alive():
            return _error(503, "the engine loop is not running", "service_unavailable")
        return web.Response(text="ok")

    async def models(self, _: web.Request) -> web.Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "infertune",
            "root": str(self.model_dir) if self.model_dir else self.model_name,
            "max_model_len": self.engine.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics_handler(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # ---- generation ---------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        arrival = time.perf_counter()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the request body is not valid JSON", "invalid_request_error")
        try:
            req = parse_request(body, self.tokenizer, chat=chat, template=self.chat_template)
        except BadRequestError as exc:
            return _error(400, str(exc), "invalid_request_error", exc.param)
        if req.model is not None and req.model not in (self.model_name, str(self.model_dir)):
            return _error(404, f"The model `{req.model}` does not exist.", "NotFoundError", "model")
        max_tokens = req.max_tokens
        if max_tokens is None:  # chat without a limit: fill the context
            max_tokens = max(1, self.engine.max_model_len - len(req.prompt_ids))
        try:
            seq_id, queue = self.engine.add_request(
                req.prompt_ids,
                max_tokens=max(1, max_tokens),  # echo with 0: one token, never shown (as vLLM)
                sampling=req.sampling,
                ignore_eos=req.ignore_eos,
                logprobs=req.logprobs,
                prompt_logprobs=req.echo and req.logprobs is not None,
            )
        except RequestRejectedError as exc:
            return _error(400, str(exc), "invalid_request_error", "max_tokens")
        except EngineOverloadedError as exc:
            self.metrics.rejected.inc()
            return _error(503, str(exc), "service_unavailable")
        self.metrics.prompt_tokens.inc(len(req.prompt_ids))
        stream = _Stream(req, seq_id, queue, arrival, IncrementalDetokenizer(self.tokenizer))
        try:
            if req.stream:
                return await self._stream(request, stream, chat)
            while not stream.done:
                self._record(stream, await queue.get())
            if stream.error is not None:
                return _error(500, f"generation failed: {stream.error}", "internal_error")
            return web.json_response(self._full_body(stream, chat))
        finally:
            if not stream.done or stream.finish_reason == "stop":
                # The client left, or a stop string ended it early: free the sequence now.
                self.engine.abort(seq_id)

    def _record(self, stream: _Stream, event: TokenEvent) -> str:
        previous = stream.token_times[-1] if stream.token_times else None
        delta = stream.take(event)
        new_times = stream.token_times[len(stream.token_times) - len(event.token_ids) :]
        if event.token_ids:
            self.metrics.observe_tokens(stream.arrival, previous, new_times)
        if stream.done:
            self.metrics.observe_finished(
                reason=stream.finish_reason or "abort",
                prompt_tokens=len(stream.request.prompt_ids),
                token_times=stream.token_times,
                arrival=stream.arrival,
                end=time.perf_counter(),
                queue_time=stream.queue_time,
            )
        return delta

    async def _stream(
        self, request: web.Request, stream: _Stream, chat: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        encode = _ChunkEncoder(rid, chat, self.model_name, stream.request.include_usage)
        first = True
        req = stream.request
        text = TokenText(self.tokenizer, req.tokens_as_ids)
        offset = 0  # text offset of the next token, for completions' logprobs
        while not stream.done:
            events = [await stream.queue.get()]
            while not stream.queue.empty():  # a slow reader gets the backlog in one write
                events.append(stream.queue.get_nowait())
            out = bytearray()
            for event in events:  # the engine sends one token per event (none when aborted)
                if stream.done:
                    break
                delta = self._record(stream, event)
                finish = stream.finish_reason if stream.done else None
                if first and req.echo:
                    prompt = self.tokenizer.decode(req.prompt_ids)
                    lp = self._prompt_logprobs(stream, text) if req.logprobs is not None else None
                    offset = len(prompt)
                    out += encode(prompt, finish if stream.echo_only else None, True, lp)
                    first = False
                    if stream.echo_only:
                        break
                lp = None
                if req.logprobs is not None and event.logprobs:
                    ids = [e.token_id for e in event.logprobs]
                    lp = (
                        chat_logprobs(event.logprobs, text)
                        if chat
                        else completion_logprobs(ids, list(event.logprobs), text, offset)
                    )
                    offset += sum(len(text(t)) for t in ids)
                out += encode(delta, finish, first, lp)
                first = False
            if stream.done:
                if stream.error is not None:
                    err = {"error": {"message": f"generation failed: {stream.error}", "code": 500}}
                    out += b"data: " + json.dumps(err).encode() + b"\n\n"
                if stream.request.include_usage:
                    usage = self._envelope(rid, chat, [])
                    usage["usage"] = stream.usage()
                    out += b"data: " + json.dumps(usage).encode() + b"\n\n"
                out += b"data: [DONE]\n\n"
            await resp.write(bytes(out))
        await resp.write_eof()
        return resp

    def _envelope(self, rid: str, chat: bool, choices: list[Any]) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
        }

    def _prompt_entries(self, stream: _Stream) -> list[TokenLogprob | None]:
        """The prompt's log-probabilities by token: None for the first, and for any the engine
        did not send (it always sends them all)."""
        n = len(stream.request.prompt_ids)
        by_position = {e.position: e for e in stream.prompt_logprobs or []}
        return [by_position.get(p) for p in range(n)]

    def _prompt_logprobs(self, stream: _Stream, text: TokenText) -> dict[str, Any]:
        return completion_logprobs(stream.request.prompt_ids, self._prompt_entries(stream), text)

    def _full_body(self, stream: _Stream, chat: bool) -> dict[str, Any]:
        req = stream.request
        text = TokenText(self.tokenizer, req.tokens_as_ids)
        if chat:
            message = {"role": "assistant", "content": stream.text}
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "finish_reason": stream.finish_reason,
            }
            if req.logprobs is not None:
                choice["logprobs"] = chat_logprobs(stream.logprobs, text)
        else:
            choice = {
                "index": 0,
                "text": stream.text,
                "logprobs": None,
                "finish_reason": stream.finish_reason,
            }
            out_ids = [] if stream.echo_only else stream.detok.ids
            entries: list[TokenLogprob | None] = list(stream.logprobs[: len(out_ids)])
            if req.echo:
                prompt = self.tokenizer.decode(req.prompt_ids)
                choice["text"] = prompt + ("" if stream.echo_only else stream.text)
            if req.logprobs is not None:
                ids = list(out_ids)
                if req.echo:
                    ids = req.prompt_ids + ids
                    entries = self._prompt_entries(stream) + entries
                choice["logprobs"] = completion_logprobs(ids, entries, text)
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": stream.usage(),
        }


class _ChunkEncoder:
    """SSE ``data:`` lines for one stream; the fixed JSON around each token is built once.

    The bytes are those of ``json.dumps`` of the chunk object (same keys, same order), only
    without re-serialising the id, model and timestamps for every token.
    """

    def __init__(self, rid: str, chat: bool, model: str, include_usage: bool) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": rid, "object": obj, "created": int(time.time()), "model": model}
        self.prefix = "data: " + json.dumps(head)[:-1] + ', "choices": [{"index": 0, '
        self.chat = chat
        self.suffix = "}]" + (', "usage": null' if include_usage else "") + "}\n\n"

    def __call__(
        self, text: str, finish: str | None, first: bool, logprobs: dict[str, Any] | None = None
    ) -> bytes:
        if self.chat:
            role = ', "role": "assistant"' if first else ""
            body = f'"delta": {{"content": {json.dumps(text)}{role}}}'
            if logprobs is not None:
                body += f', "logprobs": {json.dumps(logprobs)}'
        else:
            body = f'"text": {json.dumps(text)}, "logprobs": {json.dumps(logprobs)}'
        return (f'{self.prefix}{body}, "finish_reason": {json.dumps(finish)}{self.suffix}').encode()


async def start_server(server: EngineServer, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``server`` on ``host:port`` (port 0 picks a free one); the runner and the port."""
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    addresses = runner.addresses
    return runner, int(addresses[0][1]) if addresses else port
