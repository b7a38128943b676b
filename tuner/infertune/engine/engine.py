"""The engine: one synchronous :meth:`Engine.step` (take new requests, schedule, run the model,
apply its output), and the frontend the HTTP server talks to.

:meth:`Engine.step` is a few plain lines with no thread and no asyncio; two thin drivers call it.
In-process (tests, benchmarks): :meth:`Engine.start` runs it on a thread of the server's process
(torch releases the GIL inside its kernels, so the asyncio server keeps serving meanwhile),
taking requests from the event loop through a locked inbox and handing each step's tokens back
with one ``call_soon_threadsafe`` per step, not one per token. ``infertune serve``: the
engine-core process (:mod:`infertune.engine.engine_core`) calls it between reads of the pipe
and ships each step's events, with the gauges, to the server process in one message.
Timestamps are taken in the step, when a token exists, so the latency metrics do not include
the event loop's own queueing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, fields
from typing import Protocol

from infertune.engine.block_manager import BlockManager
from infertune.engine.scheduler import (
    FinishReason,
    RequestRejectedError,
    ScheduledStep,
    Scheduler,
    Sequence,
)
from infertune.engine.step import InputLogprobs, SamplingParams, StepInput, TokenLogprob

__all__ = [
    "Engine",
    "EngineFrontend",
    "EngineOverloadedError",
    "EngineStats",
    "Request",
    "RequestRejectedError",
    "Runner",
    "SamplingParams",
    "TokenEvent",
]

log = logging.getLogger(__name__)


class Runner(Protocol):
    """What the engine needs of :class:`infertune.engine.runner.ModelRunner`."""

    num_kv_blocks: int
    block_size: int

    def execute(self, batch: list[StepInput]) -> list[int | None]: ...


class EngineOverloadedError(RuntimeError):
    """The waiting queue is full; the server answers 503 with Retry-After."""


@dataclass
class TokenEvent:
    """New tokens for one request (usually one), stamped in the engine step that made them."""

    token_ids: list[int]
    time: float
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    queue_time: float | None = None  # on the request's first event: arrival to first scheduling
    # Only for requests that asked: one entry per token of this event, and on the first event
    # the prompt's (positions 1..len-1; position 0 has no preceding context).
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass(eq=False)
class Request:
    seq: Sequence
    loop: asyncio.AbstractEventLoop | None  # None in the engine-core process (its loop ships)
    queue: asyncio.Queue[TokenEvent] | None
    arrival: float
    scheduled_at: float | None = None  # first time the scheduler ran any of its tokens
    reported_queue_time: bool = False
    prompt_logprobs: list[TokenLogprob] | None = None  # gathered over the prompt's chunks
    prompt_logprobs_sent: bool = False  # a recompute after a preemption does not send them twice


@dataclass
class EngineStats:
    """Gauges read by the metrics endpoint; written by :meth:`Engine.step` only."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_preemptions: int = 0
    num_steps: int = 0

    def restore(self, other: EngineStats) -> None:
        """Take the gauges a core process sent (in place: the metrics endpoint holds this one)."""
        for f in fields(self):
            setattr(self, f.name, getattr(other, f.name))


class EngineFrontend:
    """What the HTTP server needs of an engine, in-process (:class:`Engine`) or in a core process
    (:class:`~infertune.engine.core_client.RemoteEngine`)."""

    stats: EngineStats
    max_model_len: int
    max_waiting: int
    eos_token_ids: frozenset[int]
    _ids: Iterator[int]

    def add_request(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        sampling: SamplingParams | None = None,
        ignore_eos: bool = False,
        logprobs: int | None = None,
        prompt_logprobs: bool = False,
    ) -> tuple[int, asyncio.Queue[TokenEvent]]:
        """Queue a request from the running event loop; its id and its token-event queue.
        ``logprobs``: top-k log-probabilities with each token (and, with ``prompt_logprobs``,
        with the prompt's on the first event).

        Raises :class:`RequestRejectedError` for requests that can never fit and
        :class:`EngineOverloadedError` when ``max_waiting`` requests are already queued.
        """
        seq = Sequence(
            seq_id=next(self._ids),
            prompt_ids=list(prompt_ids),
            max_tokens=max_tokens,
            sampling=sampling or SamplingParams(),
            eos_token_ids=self.eos_token_ids,
            ignore_eos=ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )
        self._validate(seq)
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._admit(Request(seq, asyncio.get_running_loop(), queue, time.perf_counter()))
        return seq.seq_id, queue

    def _validate(self, seq: Sequence) -> None:
        raise NotImplementedError

    def _admit(self, req: Request) -> None:
        """Hand the request to the loop; :class:`EngineOverloadedError` when too many wait."""
        raise NotImplementedError

    def _overloaded(self) -> EngineOverloadedError:
        return EngineOverloadedError(
            f"{self.max_waiting} requests are already waiting (--max-waiting); retry shortly"
        )

    def abort(self, seq_id: int) -> None:
        raise NotImplementedError

    def is_alive(self) -> bool:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def warmup(self) -> None:
        raise NotImplementedError

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        sampling: SamplingParams | None = None,
        ignore_eos: bool = False,
    ) -> AsyncIterator[TokenEvent]:
        """Token events for one request until it finishes; aborts it if the caller stops early."""
        seq_id, queue = self.add_request(
            prompt_ids, max_tokens=max_tokens, sampling=sampling, ignore_eos=ignore_eos
        )
        finished = False
        try:
            while not finished:
                event = await queue.get()
                finished = event.finished
                yield event
        finally:
            if not finished:
                self.abort(seq_id)


class Engine(EngineFrontend):
    """The scheduler, the KV blocks and the runner, advanced by :meth:`step`."""

    def __init__(
        self,
        runner: Runner,
        *,
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = 512,
        max_model_len: int,
        eos_token_ids: tuple[int, ...] = (),
        max_waiting: int = 512,
    ) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting={max_waiting} must be a positive integer")
        self.runner = runner
        self.block_manager = BlockManager(runner.num_kv_blocks, runner.block_size)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
        )
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_waiting = max_waiting
        self.stats = EngineStats()
        self._ids = itertools.count()
        self._requests: dict[int, Request] = {}  # the stepping thread only
        # New requests and aborts, from any thread; step() takes them.
        self._inbox: list[Request] = []
        self._aborts: list[int] = []
        self._cond = threading.Condition()
        self._outbox: list[tuple[Request, TokenEvent]] = []  # this step's events
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- the step -----------------------------------------------------------------------------
    def step(self) -> list[tuple[Request, TokenEvent]]:
        """One engine step: take new requests and aborts, schedule a batch, run the model on it
        and apply its tokens. The events it made (each request's new tokens, finishes and
        errors); the gauges in :attr:`stats` are already up to date when they are returned."""
        took_any = self._take_inbox()
        batch = self.scheduler.schedule()
        if batch.inputs:
            self._run(batch)
        self._update_stats()
        if not batch.inputs and self.scheduler.has_work and not took_any:
            time.sleep(0.001)  # nothing fits yet; should not happen, but never spin hot
        events, self._outbox = self._outbox, []
        return events

    @property
    def has_work(self) -> bool:
        """Whether :meth:`step` has anything to do (running, waiting, new or aborted requests)."""
        return bool(self._inbox or self._aborts or self.scheduler.has_work)

    def fail_all(self, message: str) -> list[tuple[Request, TokenEvent]]:
        """End every request, running or not yet taken, with ``message``; their events."""
        for seq_id, req in list(self._requests.items()):
            self.scheduler.abort(seq_id)
            self._outbox.append((req, _aborted(message)))
        self._requests.clear()
        with self._cond:
            self._outbox.extend((req, _aborted(message)) for req in self._inbox)
            self._inbox.clear()
        self._update_stats()
        events, self._outbox = self._outbox, []
        return events

    def _take_inbox(self) -> bool:
        with self._cond:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
        sched = self.scheduler
        for req in inbox:
            try:
                sched.add(req.seq)
            except RequestRejectedError as exc:  # validated on arrival; kept as a safety net
                self._outbox.append((req, TokenEvent([], _now(), True, "abort", str(exc))))
                continue
            self._requests[req.seq.seq_id] = req
        for seq_id in aborts:
            seq = sched.abort(seq_id)
            if seq is not None:
                self._outbox.append((self._requests.pop(seq_id), self._final(seq, [])))
        return bool(inbox or aborts)

    def _run(self, batch: ScheduledStep) -> None:
        now = time.perf_counter()
        for seq in batch.seqs:
            req = self._requests[seq.seq_id]
            if req.scheduled_at is None:
                req.scheduled_at = now
        try:
            tokens = self.runner.execute(batch.inputs)
            logprobs = self._take_logprobs(batch)
            emitted = self.scheduler.update(batch, tokens)
        except Exception as exc:  # never let one bad batch kill the server
            log.exception("engine step failed; aborting its %d requests", len(batch.seqs))
            failed = self.scheduler.fail(batch)
            self._outbox.extend(
                (self._requests.pop(s.seq_id), self._final(s, [], f"{exc}")) for s in failed
            )
            return
        now = time.perf_counter()
        for seq in emitted:
            tok = [seq.output_ids[-1]]
            if seq.finish_reason is None:
                req, event = self._requests[seq.seq_id], TokenEvent(tok, now)
            else:
                req, event = self._requests.pop(seq.seq_id), self._final(seq, tok, time=now)
            if not req.reported_queue_time and req.scheduled_at is not None:
                event.queue_time = req.scheduled_at - req.arrival
                req.reported_queue_time = True
            got = logprobs.get(seq.seq_id) if logprobs else None
            if got is not None and got.sampled is not None:
                event.logprobs = [got.sampled]
                if not req.prompt_logprobs_sent:
                    event.prompt_logprobs, req.prompt_logprobs = req.prompt_logprobs, None
                    req.prompt_logprobs_sent = True
            self._outbox.append((req, event))
        self.stats.num_steps += 1

    def _take_logprobs(self, batch: ScheduledStep) -> dict[int, InputLogprobs] | None:
        """This step's log-probabilities by sequence, the prompt's gathered on their requests
        (a chunk recomputed after a preemption adds no position twice); None, at no cost, when
        no input asked."""
        take = getattr(self.runner, "take_logprobs", None)  # a test's runner may have none
        by_input: dict[int, InputLogprobs] = take() if take is not None else {}
        if not by_input:  # the runner computed none: no input asked
            return None
        out: dict[int, InputLogprobs] = {}
        for i, got in by_input.items():
            seq = batch.seqs[i]
            out[seq.seq_id] = got
            req = self._requests[seq.seq_id]
            if got.prompt and not req.prompt_logprobs_sent:
                have = req.prompt_logprobs if req.prompt_logprobs is not None else []
                last = have[-1].position if have else 0
                have.extend(t for t in got.prompt if t.position > last)
                req.prompt_logprobs = have
        return out

    @staticmethod
    def _final(
        seq: Sequence, tokens: list[int], error: str | None = None, *, time: float | None = None
    ) -> TokenEvent:
        reason = seq.finish_reason or FinishReason.ABORT
        return TokenEvent(
            tokens,
            time if time is not None else _now(),
            finished=True,
            finish_reason=reason.value,
            error=error,
        )

    def _update_stats(self) -> None:
        self.stats.num_running = len(self.scheduler.running)
        self.stats.num_waiting = len(self.scheduler.waiting)
        self.stats.kv_usage = self.block_manager.usage
        self.stats.num_preemptions = self.scheduler.num_preemptions

    def warmup(self) -> None:
        """One prefill and one decode step before serving, so no request pays one-time setup.

        Call before the first step; the blocks it writes are overwritten before any request
        reads them (a position's KV is always written before it is attended to).
        """
        if self._thread is not None:
            raise RuntimeError("warmup() must run before start()")
        capacity = self.block_manager.num_blocks * self.block_manager.block_size
        n = min(8, self.max_model_len - 1, capacity - 1)
        if n < 1:
            return
        table = list(range(self.block_manager.blocks_for(n + 1)))
        greedy = SamplingParams(temperature=0.0)
        self.runner.execute([StepInput(-1, [0] * n, 0, table, True, greedy)])
        self.runner.execute([StepInput(-1, [0], n, table, True, greedy)])

    # ---- requests, from any thread ------------------------------------------------------------
    def _validate(self, seq: Sequence) -> None:
        self.scheduler.validate(seq)

    def _admit(self, req: Request) -> None:
        with self._cond:
            if self.stats.num_waiting + len(self._inbox) >= self.max_waiting:
                raise self._overloaded()
            self._inbox.append(req)
            self._cond.notify()

    def submit(self, seq: Sequence, arrival: float) -> None:
        """Queue a request the server process already validated and admitted (core process)."""
        with self._cond:
            self._inbox.append(Request(seq, None, None, arrival))
            self._cond.notify()

    def abort(self, seq_id: int) -> None:
        """Cancel a request (client went away); safe to call for finished ones."""
        with self._cond:
            self._aborts.append(seq_id)
            self._cond.notify()

    # ---- the in-process driver: a thread that steps and feeds the asyncio queues -------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="infertune-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self.has_work):
                    self._cond.wait()
                if self._stopping:
                    break
            try:
                _deliver(self.step())
            except Exception:  # a bug here must not leave every client hanging forever
                log.exception("engine loop failed; aborting all requests")
                _deliver(self.fail_all("internal engine error"))
        _deliver(self.fail_all("the engine stopped"))


def _now() -> float:
    return time.perf_counter()


def _aborted(message: str) -> TokenEvent:
    return TokenEvent([], _now(), True, FinishReason.ABORT.value, message)


def _deliver(events: list[tuple[Request, TokenEvent]]) -> None:
    """Hand events to the event loops their requests came from: one callback per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Request, TokenEvent]]] = {}
    for req, event in events:
        assert req.loop is not None
        by_loop.setdefault(req.loop, []).append((req, event))
    for loop, batch in by_loop.items():
        # A closed loop means nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_put_all, batch)


def _put_all(batch: list[tuple[Request, TokenEvent]]) -> None:
    for req, event in batch:
        assert req.queue is not None
        req.queue.put_nowait(event)
