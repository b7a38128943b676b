"""The API accepts exactly the token-length shapes the load generator can sample (one rule, in
infertune.tuner.lognormal), the shipped examples are all such shapes, and a profile the operator
builds from live traffic on a retune always is one."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from infertune.cli import main as cli_main
from infertune.operator.api import Figures
from infertune.operator.drift import observed_traffic
from infertune.operator.validation import parse_spec
from infertune.tuner.api import LengthDistribution, TrafficProfile
from infertune.tuner.api.traffic import MAX_TOKENS
from infertune.tuner.loadgen.lengths import iter_lengths, sample_lengths
from infertune.tuner.lognormal import MAX_LOGNORMAL_P95_RATIO, lognormal_params, max_lognormal_p95

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))


def _generator_accepts(traffic: TrafficProfile) -> None:
    """Build the generator's length sampler from the profile and draw from it (raises if it can't)."""
    rng = np.random.default_rng(0)
    for name, dist in (
        ("promptTokens", traffic.prompt_tokens),
        ("outputTokens", traffic.output_tokens),
    ):
        out = sample_lengths(dist, 64, rng, f"traffic.{name}")
        assert out.min() >= 1
    stream = iter_lengths(traffic.prompt_tokens, traffic.output_tokens, seed=0, batch=8)
    assert next(stream).prompt_tokens >= 1


def test_validate_names_the_field_and_the_largest_p95(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # examples/full.yaml as it shipped: lognormal mean 512, p95 2048 (p95/mean 4.00).
    doc = yaml.safe_load(EXAMPLES[[p.name for p in EXAMPLES].index("full.yaml")].read_text())
    doc["spec"]["traffic"]["promptTokens"] = {"distribution": "lognormal", "mean": 512, "p95": 2048}
    path = tmp_path / "full.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli_main(["validate", str(path)]) != 0
    out = capsys.readouterr().out
    assert "spec.traffic.promptTokens" in out
    assert f"at most {max_lognormal_p95(512)}" in out
    assert max_lognormal_p95(512) == 1980


def test_output_tokens_named_too() -> None:
    with pytest.raises(ValidationError) as err:
        TrafficProfile.model_validate(
            {"rate": 1, "outputTokens": {"distribution": "lognormal", "mean": 100, "p95": 400}}
        )
    assert err.value.errors()[0]["loc"][:1] == ("outputTokens",)
    assert f"at most {max_lognormal_p95(100)}" in err.value.errors()[0]["msg"]


@pytest.mark.parametrize("mean", [1, 2, 7, 100, 512, 4096, 270_000])
def test_the_api_and_the_generator_agree_at_the_boundary(mean: int) -> None:
    top = max_lognormal_p95(mean)
    assert (
        top == math.floor(mean * MAX_LOGNORMAL_P95_RATIO)
        or top == math.floor(mean * MAX_LOGNORMAL_P95_RATIO) - 1
    )
    lognormal_params(mean, top)  # the generator samples the largest p95 the API accepts
    LengthDistribution(distribution="lognormal", mean=mean, p95=top)
    if top + 1 <= MAX_TOKENS:
        with pytest.raises(ValueError, match="no lognormal"):
            lognormal_params(mean, top + 1)
        with pytest.raises(ValidationError) as err:
            LengthDistribution(distribution="lognormal", mean=mean, p95=top + 1)
        assert f"at most {top}" in err.value.errors()[0]["msg"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_produces_traffic_the_generator_accepts(path: Path) -> None:
    spec = parse_spec(yaml.safe_load(path.read_text())["spec"])
    _generator_accepts(spec.traffic)


lengths = st.one_of(st.none(), st.floats(min_value=0, max_value=2 * MAX_TOKENS, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(
    prompt_mean=lengths,
    prompt_p95=lengths,
    output_mean=lengths,
    output_p95=lengths,
    rate=st.one_of(st.none(), st.floats(min_value=0.001, max_value=10_000)),
)
def test_drift_built_profiles_are_ones_the_generator_accepts(
    prompt_mean: float | None,
    prompt_p95: float | None,
    output_mean: float | None,
    output_p95: float | None,
    rate: float | None,
) -> None:
    base = TrafficProfile(rate=4.0, num_requests=200)
    observed = Figures(
        request_rate=rate, prompt_tokens_mean=prompt_mean, output_tokens_mean=output_mean
    )
    notes: list[str] = []
    traffic = observed_traffic(base, observed, prompt_p95, output_p95, notes)
    _generator_accepts(traffic)
    for dist, p95 in ((traffic.prompt_tokens, prompt_p95), (traffic.output_tokens, output_p95)):
        if (
            dist.distribution == "lognormal"
            and p95 is not None
            and dist.p95 != min(MAX_TOKENS, round(p95))
        ):
            assert notes, "a clamped p95 is said so"


def test_a_heavy_tail_is_clamped_and_said_so() -> None:
    notes: list[str] = []
    traffic = observed_traffic(
        TrafficProfile(rate=1.0), Figures(prompt_tokens_mean=512.0), 2048.0, None, notes
    )
    assert traffic.prompt_tokens.p95 == max_lognormal_p95(512)
    assert notes == [
        "observed promptTokens p95 2048 is beyond any lognormal with mean 512; "
        "tuning for p95 1980, the largest the load generator can produce"
    ]
