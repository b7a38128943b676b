"""The torch-free data passed from the scheduler to the model runner each engine step.

These live apart from ``runner.py`` (which imports torch) so that the scheduler and the block
manager stay importable and testable without torch; ``runner.py`` re-exports both names.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class StepInput:
    """One sequence's share of one engine step."""

    seq_id: int
    token_ids: list[int]  # a prompt chunk, or the single last token when decoding
    start_pos: int  # absolute position of token_ids[0]; KV for positions < start_pos is cached
    block_table: list[int]  # physical KV block ids covering [0, start_pos + len(token_ids))
    sample: bool  # True on decode steps and on the last prompt chunk
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Log-probabilities, only when a request asks (OpenAI ``logprobs``/``echo``): how many of the
    # most likely tokens to report (None: none wanted, nothing computed), and the tokens that
    # follow this chunk's first positions in the prompt, whose log-probabilities are wanted too.
    logprobs: int | None = None
    score_ids: list[int] | None = None


@dataclass
class TokenLogprob:
    """One position's answer: the log-probability of the token that came next (sampled, or the
    prompt's) and the ``top`` most likely tokens with theirs, most likely first."""

    position: int  # of the token this is the log-probability of
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class InputLogprobs:
    """What a step computed for one input that asked: its scored prompt positions (in order)
    and its sampled token's (None when the input did not sample)."""

    prompt: list[TokenLogprob] = field(default_factory=list)
    sampled: TokenLogprob | None = None
