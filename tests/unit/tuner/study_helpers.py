"""What the tuner's study tests (study, parallel study, racing, trial count, warm start) share:
the built-in engine's search block over fp32 and int8, and a TPE study over a space."""

from __future__ import annotations

from typing import Any

import optuna

from infertune.tuner.space import Space
from infertune.tuner.study import make_sampler, open_study


def builtin_search(
    seqs: list[int], tokens: list[int] | None = None, seed: int | None = None
) -> dict[str, Any]:
    """A spec's `search`: the built-in engine, fp32 and int8, these maxNumSeqs and
    maxNumBatchedTokens values (default 128 and 512), KV blocks of 16; the sampler's seed if given."""
    out: dict[str, Any] = {
        "engines": ["builtin"],
        "quantizations": ["fp32", "int8"],
        "maxNumSeqs": {"values": seqs},
        "maxNumBatchedTokens": {"values": [128, 512] if tokens is None else tokens},
        "kvBlockSizes": [16],
    }
    if seed is not None:
        out["seed"] = seed
    return out


def tpe_study(
    space: Space, storage: str | None, name: str, *, seed: int = 1, startup_trials: int = 3
) -> optuna.Study:
    """A single-objective TPE study as a tuning run opens it (storage None: in memory)."""
    sampler = make_sampler(
        "tpe", space, seed=seed, multi_objective=False, startup_trials=startup_trials
    )
    return open_study(name, storage, sampler, multi_objective=False)
