"""Calibration through the engine under test's own API: no weights in the tuner.

While an engine serves a precision (the quality guard's engines, and one per engine before the
study), a few requests time it: TTFT at a few prompt lengths (non-streamed, one output token:
prefill + one step + HTTP) and the decode step at a few batch sizes (``b`` concurrent requests of
DECODE_TOKENS and of one token; the difference over the extra tokens is the step time at batch
``b``). Prompts are fresh random token ids each time, so no prefix cache answers for the engine.
The points give the precision's step-time line on that engine (what the seed planner predicts
from) and, against the analytic floors (model_shape.py, roofline.py), each phase's share of the
roofline and its bound: launch (overhead) bound when the step's fixed cost beyond the floors'
(the measured line's intercept above the floors' line) is at least half the step; else the
floor's compute or memory.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.model_shape import ModelShape
from infertune.tuner.modelprofile import ModelProfile, PrecisionProfile, phase_result
from infertune.tuner.process import TrialError
from infertune.tuner.roofline import (
    Ceilings,
    StepModel,
    decode_floor,
    fit_step_model,
    kv_dtype,
    prefill_floor,
)

if TYPE_CHECKING:
    from infertune.tuner.quality_guard import EngineQuality
    from infertune.tuner.space import Space

DECODE_TOKENS = 17  # 16 steps beyond the first token
REPEATS = 2


@dataclass
class ApiTimings:
    """What one engine at one precision answered: ms by prompt length and by batch size."""

    engine: str
    quantization: str
    ttft_ms: dict[int, float] = field(default_factory=dict)
    step_ms: dict[int, float] = field(default_factory=dict)
    context: int = 16  # the decode requests' prompt length


class _Client:
    def __init__(self, url: str, model: str, timeout: float = 300.0) -> None:
        parsed = urlparse(url)
        self.host, self.port, self.model, self.timeout = (
            parsed.hostname or "127.0.0.1",
            parsed.port or 80,
            model,
            timeout,
        )

    def complete(self, prompt: list[int], max_tokens: int) -> tuple[float, int]:
        """(seconds, completion tokens) of one non-streamed request."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            return self._complete(conn, body, max_tokens)
        except http.client.HTTPException as exc:  # a connection the engine dropped mid-answer
            raise RuntimeError(f"no answer from the engine: {exc!r}") from exc
        finally:
            conn.close()

    @staticmethod
    def _complete(
        conn: http.client.HTTPConnection, body: dict[str, object], max_tokens: int
    ) -> tuple[float, int]:
        start = time.perf_counter()
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        raw = resp.read()
        took = time.perf_counter() - start
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {raw[:200]!r}")
        usage = json.loads(raw).get("usage") or {}
        return took, int(usage.get("completion_tokens") or max_tokens)


def _prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    # Ids from the middle of the vocabulary: ordinary tokens, not the specials at either end.
    lo, hi = min(256, vocab // 4), max(min(256, vocab // 4) + 1, vocab - 256)
    return [rng.randrange(lo, hi) for _ in range(n)]


def measure(
    url: str,
    model: str,
    engine: str,
    quantization: str,
    *,
    vocab: int,
    prompt_lengths: Sequence[int],
    batches: Sequence[int],
    seed: int = 0,
) -> ApiTimings:
    client = _Client(url, model)
    rng = random.Random(seed)
    out = ApiTimings(engine, quantization)
    client.complete(_prompt(rng, 8, vocab), 2)  # warm-up: first-request costs are not a step
    refused: list[str] = []
    for n in sorted(set(prompt_lengths)):
        try:
            out.ttft_ms[n] = 1e3 * min(
                client.complete(_prompt(rng, n, vocab), 1)[0] for _ in range(REPEATS)
            )
        except RuntimeError as exc:  # longer than this engine's context: the shorter ones do
            refused.append(f"{n} tokens: {exc}")
    if not out.ttft_ms:
        raise RuntimeError("no prompt length was served: " + "; ".join(refused))
    for b in sorted(set(batches)):
        long = min(
            _concurrent(client, rng, b, DECODE_TOKENS, out.context, vocab) for _ in range(REPEATS)
        )
        short = min(_concurrent(client, rng, b, 1, out.context, vocab) for _ in range(REPEATS))
        out.step_ms[b] = max(1e3 * (long[0] - short[0]) / max(long[1] - 1, 1), 1e-3)
    return out


def _concurrent(
    client: _Client, rng: random.Random, batch: int, tokens: int, context: int, vocab: int
) -> tuple[float, int]:
    """(wall seconds until all finished, fewest tokens any made) of `batch` requests at once."""
    prompts = [_prompt(rng, context, vocab) for _ in range(batch)]
    got: list[tuple[float, int]] = []
    errors: list[BaseException] = []

    def one(p: list[int]) -> None:
        try:
            got.append(client.complete(p, tokens))
        except (OSError, RuntimeError, ValueError) as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"calibration request failed: {errors[0]}")
    return time.perf_counter() - start, min(n for _, n in got)


def profile_of(t: ApiTimings, shape: ModelShape, ceilings: Ceilings) -> PrecisionProfile:
    """The precision's profile on its engine. Lines through the measured points and through
    the floors at the same points: the measured intercept beyond the floors' (reading the
    weights, for a MoE the experts a batch touches) is the fixed per-step cost no byte or FLOP
    explains, the launch (overhead) share each phase is classified by."""
    q = t.quantization
    ctx = t.context
    pre = {n: prefill_floor(shape, ceilings, q, n) for n in t.ttft_ms}
    dec = {b: decode_floor(shape, ceilings, q, b, ctx) for b in t.step_ms}
    decode_line = fit_step_model(sorted(t.step_ms.items()))
    prefill_line = fit_step_model(sorted(t.ttft_ms.items()))
    decode_floors = fit_step_model(sorted((b, f.floor_ms) for b, f in dec.items()))
    prefill_floors = fit_step_model(sorted((n, f.floor_ms) for n, f in pre.items()))
    decode_launch = max(decode_line.fixed_ms - decode_floors.fixed_ms, 0.0)
    prefill_launch = max(prefill_line.fixed_ms - prefill_floors.fixed_ms, 0.0)
    longest = max(t.ttft_ms)
    b1, bn = min(t.step_ms), max(t.step_ms)
    return PrecisionProfile(
        quantization=q,
        weight_bytes=shape.read_bytes(q),
        kv_bytes_per_token=shape.kv_bytes_per_token(kv_dtype(q, ceilings.device)),
        flops_per_token=shape.flops_per_token(ctx),
        prefill=phase_result("prefill", longest, t.ttft_ms[longest], pre[longest], prefill_launch),
        decode=phase_result("decode", b1, t.step_ms[b1], dec[b1], decode_launch),
        decode_batched=phase_result("decode", bn, t.step_ms[bn], dec[bn], decode_launch),
        # Decode steps set the line (what ITL and throughput follow); prefill's per-token slope
        # is the better estimate of a token's cost in a long chunk when it is the larger.
        step_model=StepModel(
            decode_line.fixed_ms, max(decode_line.per_token_ms, prefill_line.per_token_ms)
        ),
    )


def plan(
    max_num_seqs: int, prompt_tokens: float, max_len: int | None
) -> tuple[list[int], list[int]]:
    """(prompt lengths, batch sizes) to time: around the spec's mean prompt, up to the engine's
    batch limit, within its context."""
    cap = (max_len or 4096) - DECODE_TOKENS - 2
    mean = max(8, round(prompt_tokens))
    lengths = sorted({max(8, min(cap, n)) for n in (mean // 4, mean, 2 * mean)})
    batches = sorted({b for b in (1, 4, 16) if b <= max_num_seqs} | {1})
    return lengths, batches


class EngineCalibrator:
    """Times every (engine, precision) it is shown serving, once, into ``profile.engines``; the
    quality guard shows it each engine it starts (``on_served``), and :meth:`before_study` starts
    one per engine the built-in profiler does not cover. Failures are notes, never the Job's end."""

    def __init__(
        self,
        spec: TuningSpec,
        profile: ModelProfile | None,
        shape: ModelShape | None,
        *,
        vocab: int,
        log: Callable[[str], None] = print,
    ) -> None:
        self.spec, self.profile, self.shape, self.vocab, self.log = spec, profile, shape, vocab, log
        self.timings: dict[tuple[str, str], ApiTimings] = {}

    def __call__(self, config: Candidate, url: str, name: str) -> None:
        profile, shape = self.profile, self.shape
        key = (config.engine, config.quantization)
        if profile is None or shape is None or key in self.timings:
            return
        lengths, batches = plan(
            config.max_num_seqs,
            self.spec.traffic.prompt_tokens.expected,
            self.spec.model.max_model_len,
        )
        try:
            t = measure(url, name, *key, vocab=self.vocab, prompt_lengths=lengths, batches=batches)
            measured = profile_of(t, shape, profile.ceilings)
        except (OSError, RuntimeError, ValueError) as exc:
            profile.notes.append(f"{key[0]} {key[1]}: not calibrated ({exc})")
            self.log(f"calibration {key[0]}/{key[1]}: failed: {exc}")
            return
        self.timings[key] = t
        profile.engines.setdefault(key[0], {})[key[1]] = measured
        self.log(
            f"calibration {key[0]}/{key[1]} through its API: TTFT "
            + ", ".join(f"{n} tok {ms:.1f}ms" for n, ms in t.ttft_ms.items())
            + "; decode step "
            + ", ".join(f"b={b} {ms:.2f}ms" for b, ms in t.step_ms.items())
            + f"; prefill {measured.prefill.bound}-bound, decode {measured.decode.bound}-bound"
        )

    def before_study(
        self, space: Space, serve: Callable[[Candidate], tuple[str, str]], quality: EngineQuality
    ) -> None:
        """One engine per searched engine other than builtin (its own profiler measured it), at
        the reference precision when searched: calibrated, and the quality guard's reference
        scored while it is up."""
        if self.profile is None or self.shape is None:
            return
        reference = self.spec.quality.reference
        for engine in space.engines:
            if engine == "builtin":
                continue
            candidates = [c for c in space.candidates() if c.engine == engine]
            if not candidates:
                continue
            pick = next((c for c in candidates if c.quantization == reference), candidates[0])
            if quality.active and any(c.quantization != reference for c in candidates):
                quality.reference(pick)  # serves it; the guard's on_served calibrates it
            if any(k[0] == engine for k in self.timings):
                continue
            try:
                url, name = serve(pick)
            except (TrialError, OSError, ValueError, RuntimeError) as exc:  # the engine says why
                self.profile.notes.append(f"{engine}: not calibrated ({exc})")
                self.log(f"calibration {engine}: the engine did not start: {exc}")
                continue
            self(pick, url, name)
