"""Quality guard: does a quantized precision still predict what the reference precision predicts?

On the spec's evaluation prompts (built-in ones when it gives none) the reference precision
generates `evalTokens` greedy tokens; each candidate precision then reads the same sequences
(teacher forcing), so both are compared on identical contexts: top-1 agreement of the next token
and the mean KL(reference || candidate) of the next-token distributions. The built-in engine's model
code is used for every engine (it is the same checkpoint and the same weight-quantization recipe);
GGUF Q4_0 and vLLM's kernels round differently, so for those engines this is an estimate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from infertune.engine.runner import ModelRunner, StepInput
from infertune.tuner.api import QualityGuard

DEFAULT_PROMPTS = (
    "The quick brown fox jumps over the lazy dog because",
    "In the beginning of the project, the engineers decided to",
    "Kubernetes schedules pods onto nodes that",
    "A good latency objective for a chat assistant is",
    "The capital of the country was moved in the year",
    "def fibonacci(n):\n    if n < 2:\n        return",
    "Once upon a time, in a small village by the sea,",
    "The results of the experiment show that the new method",
)
MAX_PROMPT_TOKENS = 96


@dataclass
class QualityResult:
    quantization: str
    reference: str
    top1_agreement: float
    kl_divergence: float
    prompts: int
    tokens: int
    passed: bool
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tokenize(model_dir: Path, prompts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [tok.encode(p).ids[:MAX_PROMPT_TOKENS] or [1] for p in prompts]


def _run(
    runner: ModelRunner, prompts: list[list[int]], steps: int, forced: list[list[int]] | None
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens (or `forced` ones) and the log-softmax of every next-token distribution."""
    block = runner.block_size
    per_seq = math.ceil((MAX_PROMPT_TOKENS + steps + 2) / block)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(prompts))]
    batch = [StepInput(i, list(p), 0, tables[i], True) for i, p in enumerate(prompts)]
    tokens: list[list[int]] = [[] for _ in prompts]
    logps: list[torch.Tensor] = []
    pos = [len(p) for p in prompts]
    for step in range(steps):
        logits, order = runner.forward_logits(batch)
        lp = torch.log_softmax(logits.float(), dim=-1)
        by_input = torch.empty_like(lp)
        by_input[torch.tensor(order)] = lp
        logps.append(by_input.cpu())
        nxt = by_input.argmax(dim=-1).tolist()
        for i in range(len(prompts)):
            tokens[i].append(forced[i][step] if forced is not None else int(nxt[i]))
        batch = [
            StepInput(i, [tokens[i][-1]], pos[i] + step, tables[i], True)
            for i in range(len(prompts))
        ]
    return tokens, logps


def compare(
    model_dir: Path, reference: str, candidates: list[str], guard: QualityGuard, device: str = "cpu"
) -> dict[str, QualityResult]:
    """Quality of each candidate precision against `reference` (the reference itself passes)."""
    prompts = _tokenize(model_dir, list(guard.prompts) or list(DEFAULT_PROMPTS))
    steps = guard.eval_tokens
    blocks = len(prompts) * math.ceil((MAX_PROMPT_TOKENS + steps + 2) / 16) + 1

    def runner(q: str) -> ModelRunner:
        return ModelRunner(
            model_dir, quantization=q, kv_block_size=16, num_kv_blocks=blocks, device=device
        )

    with torch.inference_mode():
        ref_tokens, ref_logps = _run(runner(reference), prompts, steps, None)
        out: dict[str, QualityResult] = {}
        for q in dict.fromkeys(candidates):
            if q == reference:
                out[q] = QualityResult(
                    q, reference, 1.0, 0.0, len(prompts), len(prompts) * steps, True
                )
                continue
            _, logps = _run(runner(q), prompts, steps, ref_tokens)
            agree = 0
            kl = 0.0
            for ref, cand in zip(ref_logps, logps, strict=True):
                agree += int((ref.argmax(-1) == cand.argmax(-1)).sum())
                kl += float((ref.exp() * (ref - cand)).sum(-1).sum())
            n = len(prompts) * steps
            out[q] = judge(q, reference, agree / n, kl / n, len(prompts), n, guard)
    return out


def judge(
    q: str, reference: str, top1: float, kl: float, prompts: int, tokens: int, guard: QualityGuard
) -> QualityResult:
    reasons = []
    if top1 < guard.min_top1_agreement:
        reasons.append(f"top-1 agreement {top1:.3f} < minTop1Agreement {guard.min_top1_agreement}")
    if guard.max_kl_divergence is not None and kl > guard.max_kl_divergence:
        reasons.append(f"KL divergence {kl:.4f} > maxKlDivergence {guard.max_kl_divergence}")
    return QualityResult(
        q, reference, top1, kl, prompts, tokens, not reasons, "; ".join(reasons) or None
    )
