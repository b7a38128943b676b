"""Length distributions: fixed, uniform, lognormal from mean and p95, and JSONL replay."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from infertune.tuner.api import LengthDistribution
from infertune.tuner.loadgen.lengths import (
    LengthPair,
    iter_lengths,
    lognormal_params,
    read_replay,
    sample_lengths,
)


def _dist(**kw: object) -> LengthDistribution:
    return LengthDistribution.model_validate(kw)


def test_fixed_is_exact() -> None:
    out = sample_lengths(_dist(distribution="fixed", mean=77), 100, np.random.default_rng(0))
    assert set(out.tolist()) == {77}


def test_uniform_covers_both_ends_and_nothing_else() -> None:
    out = sample_lengths(
        _dist(distribution="uniform", min=5, max=9), 5000, np.random.default_rng(0)
    )
    assert set(out.tolist()) == {5, 6, 7, 8, 9}
    assert out.mean() == pytest.approx(7, abs=0.1)


@pytest.mark.parametrize(("mean", "p95"), [(128, 256), (512, 1500), (64, 65)])
def test_lognormal_has_the_requested_mean_and_p95(mean: int, p95: int) -> None:
    out = sample_lengths(
        _dist(distribution="lognormal", mean=mean, p95=p95), 200_000, np.random.default_rng(0)
    )
    assert out.mean() == pytest.approx(mean, rel=0.02)
    assert np.percentile(out, 95) == pytest.approx(p95, rel=0.03)
    assert out.min() >= 1


def test_impossible_lognormal_names_the_limit() -> None:
    with pytest.raises(ValueError, match=r"most a lognormal allows is 3\.87"):
        lognormal_params(100, 1000, "traffic.promptTokens")


def test_replay_reads_both_spellings_and_cycles(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [{"prompt_tokens": 10, "output_tokens": 3}, {"promptTokens": 20, "outputTokens": 4}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    replay = read_replay(path)
    assert replay == [LengthPair(10, 3), LengthPair(20, 4)]
    stream = iter_lengths(_dist(mean=1), _dist(mean=1), replay=replay)
    assert [next(stream) for _ in range(3)] == [
        LengthPair(10, 3),
        LengthPair(20, 4),
        LengthPair(10, 3),
    ]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ('{"prompt_tokens": 0, "output_tokens": 3}', "prompt_tokens must be an integer >= 1"),
        ('{"prompt_tokens": 5}', "output_tokens must be an integer >= 1"),
        ("[1, 2]", "expected an object"),
    ],
)
def test_bad_replay_rows_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_tokens": 1, "output_tokens": 1}\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as err:
        read_replay(path)
    assert "bad.jsonl:2" in str(err.value)
