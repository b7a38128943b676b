"""The quality guard during a study: each (engine, precision) the search tries is measured once,
on that engine, against the reference precision served by the same engine (quality.py says what
is measured, quality_api.py how it is asked).

The engines are the trials' own (``serve``: the trial runner's engine for a configuration, kept
running, so the trial that follows reuses it); the reference is served once per engine, with the
candidate's other knobs. A reference the engine cannot serve is replaced by the next of fp32,
bf16, fp16 it can, and the result says which. A precision that cannot be measured (the engine
does not start, answers no log-probabilities) is not judged: the note says why, and its trial
reports whatever the engine does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.process import TrialError
from infertune.tuner.quality import (
    DEFAULT_PROMPTS,
    MAX_PROMPT_TOKENS,
    QualityResult,
    agreement,
    heldout_text,
    judge,
    perplexity,
)
from infertune.tuner.quality_api import ApiScorer, ScoringError, tokenizer_ids, wait_ready

# A configuration -> the (base URL, served model name) of an engine serving it; raises when the
# engine cannot start (process.TrialError).
ServeFn = Callable[[Candidate], tuple[str, str]]
# Called with every engine the guard had up, while it is up (the calibration's hook).
OnServed = Callable[[Candidate, str, str], None]
FALLBACK_REFERENCES = ("fp32", "bf16", "fp16")
HELDOUT_TOKENS = 1000  # within llama-server's 1024-token slot with the one it generates


@dataclass
class _Reference:
    precision: str
    sequences: list[list[int]]  # each prompt + the reference's greedy continuation
    prompt_lengths: list[int]
    top: list[dict[int, float]]  # at every continuation position, all prompts in order
    text_perplexity: float
    text_tokens: int


class EngineQuality:
    def __init__(
        self,
        spec: TuningSpec,
        model_dir: Path,
        serve: ServeFn,
        *,
        log: Callable[[str], None] = print,
        on_served: OnServed | None = None,
    ) -> None:
        self.spec, self.model_dir, self.serve, self.log = spec, model_dir, serve, log
        self.on_served = on_served
        self.results: dict[str, QualityResult] = {}  # "engine/precision" -> measured
        self.notes: dict[str, str] = {}  # "engine/precision" -> why it was not measured
        self._references: dict[str, _Reference | str] = {}  # engine -> scores, or why none

    @property
    def active(self) -> bool:
        return self.spec.quality.enabled

    def get(self, config: Candidate) -> QualityResult | None:
        """The quality of `config`'s precision on its engine (measured on first ask); None when
        the guard is off, for the reference itself, or when it could not be measured."""
        guard = self.spec.quality
        q, engine = config.quantization, config.engine
        if not guard.enabled or q == guard.reference:
            return None
        key = f"{engine}/{q}"
        if key in self.results or key in self.notes:
            return self.results.get(key)
        ref = self.reference(config)
        if isinstance(ref, str):
            self.notes[key] = f"not measured: {ref}"
        elif ref.precision == q:
            return None  # the fallback reference is this precision
        else:
            try:
                self.results[key] = self._measure(config, ref)
            except (TrialError, ScoringError, OSError, RuntimeError, ValueError) as exc:
                self.notes[key] = f"not measured: {exc}"
        if key in self.notes:
            self.log(f"quality {key}: {self.notes[key]}")
        else:
            r = self.results[key]
            self.log(
                f"quality {key} vs {r.reference}: {r.figures()} -> {'ok' if r.passed else 'infeasible'}"
            )
        return self.results.get(key)

    # ---- the reference, once per engine -------------------------------------------------------
    def reference(self, config: Candidate) -> _Reference | str:
        engine = config.engine
        if engine not in self._references:
            self._references[engine] = self._measure_reference(config)
        return self._references[engine]

    def _measure_reference(self, config: Candidate) -> _Reference | str:
        guard = self.spec.quality
        try:
            prompts = tokenizer_ids(
                self.model_dir, list(guard.prompts) or list(DEFAULT_PROMPTS), MAX_PROMPT_TOKENS
            )
            text = tokenizer_ids(self.model_dir, [heldout_text()], self._text_limit())[0]
        except ScoringError as exc:
            return str(exc)
        why: list[str] = []
        for precision in dict.fromkeys([guard.reference, *FALLBACK_REFERENCES]):
            try:
                scorer = self._scorer(config.replace(quantization=precision))
            except (TrialError, OSError, ValueError, RuntimeError) as exc:  # the engine says why
                why.append(f"{precision}: {exc}")
                continue
            try:
                sequences = [p + scorer.continue_greedy(p, guard.eval_tokens) for p in prompts]
                top: list[dict[int, float]] = []
                for p, seq in zip(prompts, sequences, strict=True):
                    top += scorer.score(seq).top[len(p) - 1 :]
                scored = scorer.score(text)
            except (ScoringError, OSError) as exc:
                why.append(f"{precision}: {exc}")
                continue
            finally:
                scorer.close()
            if precision != guard.reference:
                self.log(f"quality on {config.engine}: reference {precision} ({'; '.join(why)})")
            return _Reference(
                precision,
                sequences,
                [len(p) for p in prompts],
                top,
                perplexity(scored.actual),
                len(scored.actual),
            )
        return f"no reference precision served on {config.engine}: " + "; ".join(why)

    def _text_limit(self) -> int:
        """Held-out tokens scored: within the context the spec gives the engines."""
        limit = self.spec.model.max_model_len
        return min(HELDOUT_TOKENS, limit - 2) if limit else HELDOUT_TOKENS

    def _scorer(self, config: Candidate) -> ApiScorer:
        url, name = self.serve(config)
        scorer = ApiScorer(url, name)
        wait_ready(scorer)
        if self.on_served is not None:
            self.on_served(config, url, name)
        return scorer

    # ---- a candidate ---------------------------------------------------------------------------
    def _measure(self, config: Candidate, ref: _Reference) -> QualityResult:
        scorer = self._scorer(config)
        try:
            top: list[dict[int, float]] = []
            for n, seq in zip(ref.prompt_lengths, ref.sequences, strict=True):
                top += scorer.score(seq).top[n - 1 :]
            text = scorer.score(
                tokenizer_ids(self.model_dir, [heldout_text()], self._text_limit())[0]
            )
        finally:
            scorer.close()
        top1, kl = agreement(ref.top, top)
        return judge(
            config.quantization,
            ref.precision,
            top1,
            kl,
            len(ref.sequences),
            len(top),
            self.spec.quality,
            engine=config.engine,
            perplexity=perplexity(text.actual),
            reference_perplexity=ref.text_perplexity,
            perplexity_tokens=len(text.actual),
            method=scorer.method or "",
        )
