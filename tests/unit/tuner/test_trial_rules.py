"""Early stopping is only taken when the SLO is certainly lost; margins and failure kinds are right."""

from __future__ import annotations

from infertune.tuner.api import SLO
from infertune.tuner.loadgen.client import RequestRecord
from infertune.tuner.loadgen.stats import summarize
from infertune.tuner.process import classify_exit, local_argv
from infertune.tuner.trial import certain_violation, slo_margins

SLO_ = SLO.model_validate({"ttft": {"max": "100ms", "percentile": "p90"}})


def records(ttfts: list[float]) -> list[RequestRecord]:
    out = []
    for i, t in enumerate(ttfts):
        r = RequestRecord(i, 10, 4, start=float(i), end=float(i) + t + 0.01, ttft=t, chunks=4)
        r.itl = [0.001, 0.001, 0.001]
        out.append(r)
    return out


def snapshot(ttfts: list[float]):  # type: ignore[no-untyped-def]
    recs = records(ttfts)
    return summarize(
        recs, slo=SLO_, mode="closed", rate=None, concurrency=1, started=0.0,
        finished=float(len(recs)), dispatch_end=float(len(recs)), in_flight=[],
        prompt_length_exact=True,
    )  # fmt: skip


def test_stops_only_when_the_percentile_is_lost() -> None:
    # p90 over 50 planned requests tolerates 5 slow ones; 6 slow ones make the miss certain.
    assert certain_violation(snapshot([0.5] * 5 + [0.01] * 5), SLO_, 50, 4) is None
    why = certain_violation(snapshot([0.5] * 7), SLO_, 50, 4)
    assert why is not None and why.startswith("ttft p90 <= 100ms")


def test_margins_are_bound_minus_measured() -> None:
    margins, met = slo_margins({"ttftP90Ms": 80.0}, SLO_)
    assert margins == {"ttft": 20.0} and met == {"ttft": True}
    margins, met = slo_margins({}, SLO_)
    assert met == {"ttft": False}


def test_failure_kinds() -> None:
    assert classify_exit(1, "torch.OutOfMemoryError: CUDA out of memory") == "oom"
    assert classify_exit(2, "infertune serve: cuda_graph=True needs a CUDA device") == "unsupported"
    assert classify_exit(-11, "Segmentation fault") == "crash"


def test_infertune_argv_runs_through_this_interpreter() -> None:
    import sys

    argv = local_argv(["infertune", "serve", "--model", "m"])
    assert argv[:3] == [sys.executable, "-m", "infertune.engine.cli"] and argv[3] == "serve"
