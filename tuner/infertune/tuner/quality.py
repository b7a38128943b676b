"""Quality guard: does a quantized precision still predict what the reference precision predicts,
on the engine that would serve it?

Measured through the engine's own OpenAI API (quality_api.py), never with the tuner's own model
code: the reference precision, served by the same engine, greedily continues the evaluation
prompts (the spec's, else the built-in ones) by `evalTokens`; both precisions then score the same
token sequences (teacher forcing), and the top-k log-probabilities of the continuation's
positions give the top-1 agreement and the KL divergence; the held-out text shipped with the
project (data/heldout.txt) gives each precision's perplexity. Torch-free: the arithmetic here.

KL from top-k (k = TOP_K, the most vLLM returns by default): both distributions are coarsened to
the reference's top-k tokens plus one bucket for the rest, which by the data-processing
inequality is a lower bound of the full KL; a reference token missing from the candidate's top-k
takes the candidate's k-th log-probability (an upper bound of its own, so the estimate stays low
rather than inventing divergence).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any

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
TOP_K = 20

# One position's answer: token id -> log-probability for the top-k (and the scored token).
TopK = Mapping[int, float]


def heldout_text() -> str:
    """The held-out plain-English text perplexity is measured on (written for this project and
    dedicated to the public domain: no model has seen it)."""
    return resources.files("infertune.tuner").joinpath("data/heldout.txt").read_text("utf-8")


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
    engine: str = ""
    perplexity: float | None = None
    reference_perplexity: float | None = None
    perplexity_tokens: int = 0
    method: str = ""  # how the engine was asked: echo (prompt logprobs) or stepwise

    @property
    def perplexity_increase(self) -> float | None:
        """Relative perplexity increase over the reference (0.05 = +5%)."""
        if self.perplexity is None or not self.reference_perplexity:
            return None
        return self.perplexity / self.reference_perplexity - 1.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["perplexity_increase"] = self.perplexity_increase
        return out

    def figures(self) -> str:
        """The measured figures, for a reason or a log line."""
        text = f"top-1 agreement {self.top1_agreement:.3f}, KL {self.kl_divergence:.4f}"
        if self.perplexity is not None and self.reference_perplexity is not None:
            text += (
                f", perplexity {self.perplexity:.2f} vs {self.reference_perplexity:.2f} "
                f"({100 * (self.perplexity_increase or 0.0):+.1f}%)"
            )
        return text


def top1(dist: TopK) -> int:
    return max(dist, key=lambda t: dist[t])


def kl_topk(ref: TopK, cand: TopK, k: int = TOP_K) -> float:
    """KL(ref || cand) over ref's k most likely tokens plus one bucket for the rest."""
    ranked = sorted(ref, key=lambda t: ref[t], reverse=True)[:k]
    floor = min(cand.values()) if cand else -30.0
    kl = 0.0
    p_rest, q_rest = 1.0, 1.0
    for t in ranked:
        lp = ref[t]
        lq = min(cand.get(t, floor), 0.0)
        p = math.exp(lp)
        kl += p * (lp - lq)
        p_rest -= p
        q_rest -= math.exp(lq)
    p_rest, q_rest = max(p_rest, 0.0), max(q_rest, 1e-12)
    if p_rest > 1e-12:
        kl += p_rest * math.log(p_rest / q_rest)
    return max(kl, 0.0)


def agreement(ref: Sequence[TopK], cand: Sequence[TopK]) -> tuple[float, float]:
    """(top-1 agreement, mean KL) over positions scored by both."""
    n = len(ref)
    if n == 0 or len(cand) != n:
        raise ValueError(f"scored {n} reference positions and {len(cand)} candidate ones")
    agree = sum(top1(r) == top1(c) for r, c in zip(ref, cand, strict=True))
    kl = sum(kl_topk(r, c) for r, c in zip(ref, cand, strict=True))
    return agree / n, kl / n


def perplexity(logprobs: Sequence[float]) -> float:
    """exp of the mean negative log-likelihood of the text's tokens."""
    if not logprobs:
        raise ValueError("no token scored")
    return math.exp(-sum(logprobs) / len(logprobs))


def judge(
    q: str,
    reference: str,
    top1_agreement: float,
    kl: float,
    prompts: int,
    tokens: int,
    guard: QualityGuard,
    **measured: Any,
) -> QualityResult:
    """The result with every bound the spec sets checked; the reason names each one missed and
    carries every figure measured."""
    result = QualityResult(q, reference, top1_agreement, kl, prompts, tokens, True, **measured)
    reasons = []
    if top1_agreement < guard.min_top1_agreement:
        reasons.append(
            f"top-1 agreement {top1_agreement:.3f} < minTop1Agreement {guard.min_top1_agreement}"
        )
    if guard.max_kl_divergence is not None and kl > guard.max_kl_divergence:
        reasons.append(f"KL divergence {kl:.4f} > maxKlDivergence {guard.max_kl_divergence}")
    rise = result.perplexity_increase
    bound = guard.max_perplexity_increase
    if bound is not None and rise is not None and rise > bound:
        reasons.append(
            f"perplexity +{100 * rise:.1f}% > maxPerplexityIncrease {bound} (+{100 * bound:.1f}%)"
        )
    if reasons:
        result.passed = False
        where = f" on {result.engine}" if result.engine else ""
        result.reason = (
            f"{q} vs {reference}{where}: " + "; ".join(reasons) + f" ({result.figures()})"
        )
    return result


def shortfall(result: QualityResult, guard: QualityGuard) -> float:
    """How far a failed result is from passing, as a share of its worst bound (the study's
    constraint value for an infeasible-quality trial)."""
    worst = max(guard.min_top1_agreement - result.top1_agreement, 0.0)
    if guard.max_kl_divergence:
        worst = max(worst, result.kl_divergence / guard.max_kl_divergence - 1.0)
    rise = result.perplexity_increase
    if guard.max_perplexity_increase is not None and rise is not None:
        worst = max(worst, rise - guard.max_perplexity_increase)
    return max(worst, 1e-3)
