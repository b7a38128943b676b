"""The operator reads exactly what the tuner writes: its real compact_summary, not a copy of it."""

from __future__ import annotations

import json

from infertune.operator.summary import Summary, parse_summary
from infertune.tuner.result import TrialRecord, TuningResult, compact_summary
from infertune.tuner.trial import FIGURE_KEYS


def test_real_compact_summary_parses_into_status_models() -> None:
    figures = {k: 10.0 + i for i, k in enumerate(FIGURE_KEYS)}
    best = TrialRecord(
        number=3, outcome="ok", feasible=True, objective=7.5, figures=figures, margins_ms={"ttft": 80.0},
        config={"engine": "builtin", "quantization": "int8", "max_num_seqs": 16,
                "max_num_batched_tokens": 512, "kv_block_size": 16, "cuda_graph": False},
    )  # fmt: skip
    result = TuningResult(
        study="ns-x-abcdef12", status="infeasible", reason="", objective="goodput",
        hardware={"kind": "gpu", "product": "NVIDIA-H100-80GB-HBM3"}, slo={}, trials=[best],
        trials_total=10, best=best, binding_constraint="ttft p95 <= 300ms: best achieved 412ms",
    )  # fmt: skip
    parsed = parse_summary(json.dumps(compact_summary(result)))
    assert isinstance(parsed, Summary), parsed
    assert parsed.status == "infeasible" and parsed.gpu_product == "NVIDIA-H100-80GB-HBM3"
    assert parsed.binding_constraint == "ttft p95 <= 300ms: best achieved 412ms"
    config = parsed.serving_config()
    assert (
        config is not None and config.max_num_seqs == 16 and config.slo_margins_ms == {"ttft": 80.0}
    )
    measured = config.measured.model_dump(exclude_none=True) if config.measured else {}
    # Every figure the tuner reports lands in a Figures field (none silently dropped).
    assert len(measured) == len(FIGURE_KEYS), (sorted(measured), FIGURE_KEYS)
