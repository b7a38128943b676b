"""Prompt and output token-length samplers built from the spec's LengthDistribution, or a replay file.

Lognormal lengths are given the way people describe traffic, by mean and p95; the underlying
(mu, sigma) come from :func:`infertune.tuner.lognormal.lognormal_params`, the rule the API checks
a spec with.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infertune.tuner.api import LengthDistribution
from infertune.tuner.lognormal import MAX_LOGNORMAL_P95_RATIO, Z95, lognormal_params

__all__ = [
    "MAX_LOGNORMAL_P95_RATIO",
    "Z95",
    "LengthPair",
    "iter_lengths",
    "lognormal_params",
    "read_replay",
    "sample_lengths",
]


def sample_lengths(
    dist: LengthDistribution, n: int, rng: np.random.Generator, field: str = "lengths"
) -> np.ndarray:
    """`n` integer token lengths (each >= 1) drawn from `dist`."""
    if dist.distribution == "fixed":
        assert dist.mean is not None
        return np.full(n, dist.mean, dtype=np.int64)
    if dist.distribution == "uniform":
        assert dist.min is not None and dist.max is not None
        return rng.integers(dist.min, dist.max, n, endpoint=True, dtype=np.int64)
    assert dist.mean is not None and dist.p95 is not None
    mu, sigma = lognormal_params(dist.mean, dist.p95, field)
    raw = rng.lognormal(mu, sigma, n)
    return np.maximum(1, np.rint(raw)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class LengthPair:
    prompt_tokens: int
    output_tokens: int


def read_replay(path: Path) -> list[LengthPair]:
    """Rows of {"prompt_tokens": int, "output_tokens": int} (camelCase accepted), one per line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"traffic.replayFile {str(path)!r}: cannot read: {exc.strerror}") from exc
    rows: list[LengthPair] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"traffic.replayFile {path}:{lineno}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{where}: not JSON: {exc}") from exc
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected an object with prompt_tokens and output_tokens")
        p = obj.get("prompt_tokens", obj.get("promptTokens"))
        o = obj.get("output_tokens", obj.get("outputTokens"))
        for name, value in (("prompt_tokens", p), ("output_tokens", o)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {name} must be an integer >= 1, got {value!r}")
        assert isinstance(p, int) and isinstance(o, int)
        rows.append(LengthPair(p, o))
    if not rows:
        raise ValueError(f"traffic.replayFile {path}: no rows")
    return rows


def iter_lengths(
    prompt: LengthDistribution,
    output: LengthDistribution,
    *,
    replay: list[LengthPair] | None = None,
    seed: int | None = None,
    batch: int = 1024,
) -> Iterator[LengthPair]:
    """(prompt, output) lengths of successive requests, forever; a replay file is cycled in order."""
    if replay:
        while True:
            yield from replay
    rng = np.random.default_rng(seed)
    while True:
        ps = sample_lengths(prompt, batch, rng, "traffic.promptTokens")
        os_ = sample_lengths(output, batch, rng, "traffic.outputTokens")
        for p, o in zip(ps, os_, strict=True):
            yield LengthPair(int(p), int(o))
