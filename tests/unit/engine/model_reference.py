"""Shared helpers for the model-side tests: the tiny checkpoint, prompts and HF references."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from infertune.engine.make_model import ensure_model
from infertune.engine.runner import ModelRunner, SamplingParams, StepInput

PROMPTS = (
    "Return the list of files in the directory.",
    "The quick brown fox",
    "def main():",
    "Socket objects have the following methods",
    "Hello",
    "A dictionary maps keys to values, and",
    "Raise ValueError if the",
    "1 2 3 4 5",
)
NEW_TOKENS = 64

# These tests check tokens, not speed. On a shared 2-core machine OpenMP's spinning threads
# made them 8x slower (35 s with one thread vs 4.5 min with two, measured under load).
torch.set_num_threads(1)


@cache
def tiny_model() -> Path:
    return ensure_model("tiny")


@cache
def prompt_ids() -> tuple[tuple[int, ...], ...]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model() / "tokenizer.json"))
    return tuple(tuple(tok.encode(p).ids) for p in PROMPTS)


@dataclass(frozen=True)
class Reference:
    """HF transformers' greedy continuation (fp32 unless asked) and the logits that chose it."""

    tokens: tuple[int, ...]  # NEW_TOKENS greedy tokens
    logits: torch.Tensor  # [NEW_TOKENS, vocab]: logits that chose each token


@cache
def hf_reference(dtype: torch.dtype = torch.float32) -> tuple[Reference, ...]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_model(), dtype=dtype).eval()
    refs = []
    with torch.inference_mode():
        for ids in prompt_ids():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
            tokens = tuple(out.sequences[0, len(ids) :].tolist())
            logits = torch.cat([step.float() for step in out.logits], dim=0)
            refs.append(Reference(tokens, logits))
    return tuple(refs)


def generate_single(
    runner: ModelRunner, ids: tuple[int, ...], n: int, table: list[int]
) -> list[int]:
    """Greedy tokens for one sequence alone: one prefill, then one decode step per token."""
    greedy = SamplingParams()
    nxt = runner.execute([StepInput(0, list(ids), 0, table, True, greedy)])[0]
    out: list[int] = []
    pos = len(ids)
    for _ in range(n):
        assert nxt is not None
        out.append(nxt)
        nxt = runner.execute([StepInput(0, [nxt], pos, table, True, greedy)])[0]
        pos += 1
    return out
