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
