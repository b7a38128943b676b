"""Continuous batching: which sequences run, and how many of their tokens, in each engine step.

Torch-free (nano-vllm's ``scheduler.py`` and vLLM v1's unified token budget are the models).
Each step spends at most ``max_num_batched_tokens`` tokens over at most ``max_num_seqs``
running sequences, in this order:

1. running sequences that are decoding (one token each), oldest first, so that a long prompt
   never stalls the streams already producing tokens;
2. running sequences part-way through their prompt (chunked prefill), oldest first, each taking
   what is left of the budget;
3. waiting sequences, first come first served, admitted with a first prompt chunk.

When the KV pool cannot hold a running sequence's next tokens, the newest running sequence is
preempted by recompute: its blocks are freed and it goes back to the head of the waiting queue
with its prompt and the tokens generated so far, which are prefilled again on readmission. The
oldest sequence therefore always makes progress, and :meth:`Scheduler.add` rejects any request
that could not fit in the whole pool on its own.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field

from infertune.engine.block_manager import BlockManager
from infertune.engine.step import SamplingParams, StepInput

__all__ = ["FinishReason", "RequestRejectedError", "Scheduler", "SeqStatus", "Sequence"]


class RequestRejectedError(ValueError):
    """A request the engine can never serve (too long for the model or the KV pool)."""


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    STOP = "stop"  # an end-of-sequence token
    LENGTH = "length"  # max_tokens, or the model's context length
    ABORT = "abort"  # cancelled by the client or failed


@dataclass(eq=False)
class Sequence:
    """One request's token state as the scheduler sees it."""

    seq_id: int
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k log-probabilities per token (None: none computed)
    prompt_logprobs: bool = False  # the prompt's too (OpenAI echo), with ``logprobs`` of them
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # positions whose KV is in the cache
    status: SeqStatus = SeqStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_decoding(self) -> bool:
        return self.num_uncomputed == 1 and self.num_computed > 0

    def token_slice(self, start: int, stop: int) -> list[int]:
        """Tokens ``[start, stop)`` of prompt followed by output."""
        n_prompt = len(self.prompt_ids)
        if stop <= n_prompt:
            return self.prompt_ids[start:stop]
        if start >= n_prompt:
            return self.output_ids[start - n_prompt : stop - n_prompt]
        return self.prompt_ids[start:] + self.output_ids[: stop - n_prompt]


@dataclass
class ScheduledStep:
    """The scheduler's plan for one step: the runner inputs and the sequences they belong to."""

    seqs: list[Sequence]
    inputs: list[StepInput]
    num_preempted: int = 0

    def __len__(self) -> int:
        return len(self.inputs)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs} must be a positive integer")
        if max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens={max_num_batched_tokens} must be a positive integer"
            )
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order: the last one is the newest
        self.num_preemptions = 0
        # Admitting a new prompt into the last free blocks would only get it preempted by the
        # next decode step that crosses a block boundary; keep ~1% of the pool in reserve.
        self._watermark = max(1, math.ceil(0.01 * block_manager.num_blocks))

    # ---- requests in and out ------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue ``seq``; :class:`RequestRejectedError` when it could never run to completion."""
        self.validate(seq)
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def validate(self, seq: Sequence) -> None:
        """Raise :class:`RequestRejectedError` unless ``seq`` fits the model and the whole KV pool.

        Reads only fixed settings, so any thread may call it.
        """
        if not seq.prompt_ids:
            raise RequestRejectedError("the prompt is empty; it must hold at least one token")
        if seq.max_tokens < 1:
            raise RequestRejectedError(f"max_tokens={seq.max_tokens} must be at least 1")
        total = len(seq.prompt_ids) + seq.max_tokens
        if total > self.max_model_len:
            raise RequestRejectedError(
                f"prompt ({len(seq.prompt_ids)} tokens) + max_tokens ({seq.max_tokens}) = {total} "
                f"exceeds the model's context length of {self.max_model_len} tokens"
            )
        capacity = self.bm.num_blocks * self.bm.block_size
        if total > capacity:
            raise RequestRejectedError(
                f"prompt ({len(seq.prompt_ids)} tokens) + max_tokens ({seq.max_tokens}) = {total} "
                f"exceeds the KV cache capacity of {capacity} tokens; raise --kv-cache-memory"
            )

    def abort(self, seq_id: int) -> Sequence | None:
        """Drop ``seq_id`` wherever it is, freeing its blocks; the sequence, or None if unknown."""
        for seq in self.running:
            if seq.seq_id == seq_id:
                self.running.remove(seq)
                return self._finish(seq, FinishReason.ABORT)
        for seq in self.waiting:
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                return self._finish(seq, FinishReason.ABORT)
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step -----------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep:
        budget = self.max_num_batched_tokens
        planned: dict[int, int] = {}  # seq_id -> tokens this step
        preempted = 0

        # Decodes before partial prefills; within each, oldest first (running's order).
        order = [s for s in self.running if s.is_decoding]
        order += [s for s in self.running if not s.is_decoding]
        for seq in order:
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_uncomputed, budget)
            while True:
                fit = self._fit(seq, n)
                # A prefill chunk may shrink to what fits; a decode needs its one token.
                if fit == n or (fit > 0 and not seq.is_decoding):
                    n = fit
                    break
                victim = self.running[-1]
                budget += planned.pop(victim.seq_id, 0)
                self._preempt(victim)
                preempted += 1
                if victim is seq:
                    n = 0
                    break
            if n:
                self.bm.ensure(seq.seq_id, seq.num_computed + n)
                planned[seq.seq_id] = n
                budget -= n

        # Admit waiting sequences unless this step had to preempt (they would be evicted again).
        while (
            not preempted and budget > 0 and self.waiting and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[0]
            reserve = self._watermark if self.running else 0
            free_tokens = (self.bm.num_free_blocks - reserve) * self.bm.block_size
            n = min(seq.num_uncomputed, budget, free_tokens)
            if n <= 0:
                break
            self.waiting.popleft()
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            self.bm.ensure(seq.seq_id, n)
            planned[seq.seq_id] = n
            budget -= n

        seqs: list[Sequence] = []
        inputs: list[StepInput] = []
        for seq in self.running:
            n = planned.get(seq.seq_id, 0)
            if not n:
                continue
            start = seq.num_computed
            seqs.append(seq)
            inputs.append(
                StepInput(
                    seq_id=seq.seq_id,
                    token_ids=seq.token_slice(start, start + n),
                    start_pos=start,
                    block_table=list(self.bm.block_table(seq.seq_id)),
                    sample=start + n == seq.num_tokens,
                    sampling=seq.sampling,
                    logprobs=seq.logprobs,
                    score_ids=self._score_ids(seq, start, n),
                )
            )
        return ScheduledStep(seqs, inputs, preempted)

    def update(self, step: ScheduledStep, tokens: list[int | None]) -> list[Sequence]:
        """Record the runner's output for ``step``; the sequences that received a token."""
        if len(tokens) != len(step.inputs):
            raise ValueError(f"runner returned {len(tokens)} tokens for {len(step.inputs)} inputs")
        emitted: list[Sequence] = []
        for seq, inp, tok in zip(step.seqs, step.inputs, tokens, strict=True):
            if seq.status is not SeqStatus.RUNNING:
                continue
            seq.num_computed = inp.start_pos + len(inp.token_ids)
            if not inp.sample:
                continue
            if tok is None:
                raise ValueError(f"runner returned no token for sampled seq_id={seq.seq_id}")
            seq.output_ids.append(tok)
            emitted.append(seq)
            reason = self._finish_reason(seq, tok)
            if reason is not None:
                self.running.remove(seq)
                self._finish(seq, reason)
        return emitted

    def fail(self, step: ScheduledStep) -> list[Sequence]:
        """Abort every sequence of ``step`` (the runner raised); the sequences aborted."""
        failed = [s for s in step.seqs if s.status is SeqStatus.RUNNING]
        for seq in failed:
            self.running.remove(seq)
            self._finish(seq, FinishReason.ABORT)
        return failed

    # ---- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _score_ids(seq: Sequence, start: int, n: int) -> list[int] | None:
        """The prompt tokens that follow positions ``[start, start + n)``, when ``seq`` wants
        its prompt's log-probabilities (None otherwise, and past the prompt)."""
        if not seq.prompt_logprobs or seq.logprobs is None:
            return None
        stop = min(start + n + 1, len(seq.prompt_ids))
        return seq.prompt_ids[start + 1 : stop] if stop > start + 1 else None

    def _fit(self, seq: Sequence, n: int) -> int:
        """How many of ``n`` next tokens of ``seq`` the free blocks can hold."""
        have = len(self.bm.block_table(seq.seq_id)) + self.bm.num_free_blocks
        return max(0, min(n, have * self.bm.block_size - seq.num_computed))

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free(seq.seq_id)
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _finish_reason(self, seq: Sequence, tok: int) -> FinishReason | None:
        if not seq.ignore_eos and tok in seq.eos_token_ids:
            return FinishReason.STOP
        if len(seq.output_ids) >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _finish(self, seq: Sequence, reason: FinishReason) -> Sequence:
        self.bm.free(seq.seq_id)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        return seq
