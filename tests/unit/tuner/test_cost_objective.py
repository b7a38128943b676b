"""slo.objective cost-per-token: USD per million output tokens, minimised, reported."""

from __future__ import annotations

import math

import pytest
from optuna.study import StudyDirection

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.cost import CostBasis, cost_basis, parse_prices
from infertune.tuner.report import markdown
from infertune.tuner.result import TrialRecord, TuningResult, compact_summary, cost_summary
from infertune.tuner.search import Evaluation, minimises, objective_value
from infertune.tuner.study import open_study


def _spec(objective: str) -> TuningSpec:
    return TuningSpec.model_validate(
        {"model": {"uri": "builtin://tiny"}, "slo": {"ttft": {"max": "1s"}, "objective": objective}}
    )


def _ev(tps: float) -> Evaluation:
    config = Candidate(engine="builtin", quantization="fp32", max_num_seqs=8,
                       max_num_batched_tokens=256, kv_block_size=16, cuda_graph=False)  # fmt: skip
    return Evaluation(config=config, outcome="ok", figures={"outputTokensPerSecond": tps})


def test_cost_is_gpus_times_price_over_tokens_per_hour() -> None:
    basis = cost_basis(parse_prices(["NVIDIA-H100-80GB-HBM3=4", "1"]), "NVIDIA H100 80GB HBM3", 2)
    assert basis.hourly_price == 4.0  # NVML's spelling finds the label-form price
    # 2 GPUs x $4/h / (1000 tok/s x 3600 s/h) per token -> $2.222 per million tokens.
    assert basis.per_million(1000.0) == pytest.approx(2 * 4 * 1e6 / 3.6e6)
    assert cost_basis(parse_prices(["1"]), "NVIDIA-L4", 1).hourly_price == 1.0
    with pytest.raises(ValueError, match="PRODUCT=USD"):
        parse_prices(["L4=cheap"])


def test_cost_per_token_is_minimised_and_differs_from_throughput() -> None:
    spec = _spec("cost-per-token")
    basis = CostBasis(gpus=1, hourly_price=3.6)
    fast, slow = _ev(2000.0), _ev(1000.0)
    assert objective_value(fast, spec, basis) == pytest.approx(0.5)  # $ per million tokens
    assert objective_value(slow, spec, basis) == pytest.approx(1.0)
    assert minimises(spec) and not minimises(_spec("throughput"))
    assert objective_value(fast, _spec("throughput")) == 2000.0
    study = open_study("c", None, __import__("optuna").samplers.RandomSampler(),
                       multi_objective=False, minimise=True)  # fmt: skip
    assert study.direction == StudyDirection.MINIMIZE
    # No price: GPU-hours per million tokens, the same order as tokens/s per GPU.
    unknown = CostBasis(gpus=2)
    assert objective_value(fast, spec, unknown) == pytest.approx(2 * 1e6 / (2000 * 3600))
    assert "price unknown" in unknown.unit
    failed = Evaluation(config=fast.config, outcome="failed")
    assert objective_value(failed, spec, basis) > objective_value(slow, spec, basis)
    assert math.isinf(unknown.gpu_hours_per_million(0.0))


def test_report_and_summary_show_the_cost_per_million_tokens() -> None:
    win = TrialRecord(1, {"engine": "builtin"}, "ok", True, 0.5,
                      figures={"outputTokensPerSecond": 2000.0})  # fmt: skip
    default = TrialRecord(0, {"engine": "builtin"}, "ok", True, 1.0,
                          figures={"outputTokensPerSecond": 1000.0})  # fmt: skip
    result = TuningResult(
        study="s", status="succeeded", reason="", objective="cost-per-token", slo={},
        trials=[default, win], trials_total=2, best=win,
        hardware={"kind": "gpu", "product": "NVIDIA L4", "memory_bytes": 23034 * 2**20},
        cost=cost_summary(CostBasis(gpus=1, hourly_price=3.6, product="NVIDIA L4")),
    )  # fmt: skip
    text = markdown(result, [])
    assert "**Cost:** $0.5 per million output tokens" in text
    assert "| 0 | builtin | ok | 1 |  |  | 1 |" in text  # the other trial's cost, in the table
    assert compact_summary(result)["best"]["costPerMillionTokens"] == 0.5
    unknown = TuningResult(**{**result.__dict__, "cost": cost_summary(CostBasis(gpus=1))})
    assert "GPU price unknown" in markdown(unknown, [])
    assert "costPerMillionTokens" not in compact_summary(unknown)["best"]
