"""A knob is declared once: adding one to a knob set reaches the candidate, the status model (and so
the CRD), the tuner's summary, the report and an adapter's argv, with one flag line in the adapter
and no change to any other module."""

from __future__ import annotations

from pathlib import Path

import pytest

from infertune.operator.api.status import serving_config_model
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import AdapterError, VllmAdapter
from infertune.tuner.engines.base import flag
from infertune.tuner.knobs import SERVING_KNOBS, Knob
from infertune.tuner.report import markdown
from infertune.tuner.result import TrialRecord, TuningResult, compact_summary

# A knob vLLM has and the declaration does not (yet): the share of GPU memory the engine may take.
GPU_SHARE = Knob(
    "gpu_memory_utilization_pct",
    int,
    "Percent of GPU memory the engine may use.",
    engines=frozenset({"vllm"}),
    short=lambda v: f"mem={v}%",
    default=90,
)
KNOBS = SERVING_KNOBS.with_knobs(GPU_SHARE)


class VllmWithShare(VllmAdapter):
    """The one line an adapter adds for a knob it honours."""

    knob_flags = {
        **VllmAdapter.knob_flags,
        "gpu_memory_utilization_pct": lambda pct, _c: ["--gpu-memory-utilization", f"{pct / 100}"],
    }


def config(**kw: object) -> Candidate:
    base = dict(engine="vllm", quantization="bf16", max_num_seqs=16, max_num_batched_tokens=1024,
                kv_block_size=16, cuda_graph=False)  # fmt: skip
    return Candidate(knobs=KNOBS, **{**base, **kw})


def test_the_candidate_carries_a_new_knob_with_its_default_type_and_wire_name() -> None:
    c = config(gpu_memory_utilization_pct="80")
    assert c["gpu_memory_utilization_pct"] == 80  # typed by the declaration
    assert c.to_wire()["gpuMemoryUtilizationPct"] == 80
    assert Candidate.from_wire(c.to_wire(), KNOBS) == c
    assert config()["gpu_memory_utilization_pct"] == 90  # a record from before the knob still reads
    assert config().config_hash != c.config_hash  # a different value is a different deployment
    assert c.label().endswith("eager mem=80%")
    with pytest.raises(ValueError, match="takes a int"):
        config(gpu_memory_utilization_pct="most")


def test_the_status_model_and_its_schema_have_the_new_knob() -> None:
    model = serving_config_model(KNOBS)
    status = model.of(config(gpu_memory_utilization_pct=80), config_hash="abc")
    assert status.to_wire()["gpuMemoryUtilizationPct"] == 80
    assert status.candidate() == config(gpu_memory_utilization_pct=80)
    schema = model.model_json_schema(by_alias=True)["properties"]
    assert schema["gpuMemoryUtilizationPct"]["description"] == GPU_SHARE.description
    # Knobs first, in declared order; the test's knob after the declared ones.
    assert list(schema)[len(SERVING_KNOBS)] == "gpuMemoryUtilizationPct"


def test_the_summary_and_the_report_show_the_new_knob(tmp_path: Path) -> None:
    best = TrialRecord(
        number=0,
        config=config(gpu_memory_utilization_pct=80).to_dict(),
        outcome="ok",
        feasible=True,
        objective=3.0,
    )
    result = TuningResult(
        study="s", status="succeeded", reason="", hardware={"product": "cpu", "kind": "cpu"},
        objective="goodput", slo={}, trials=[best], trials_total=1, best=best,
    )  # fmt: skip
    summary_best = compact_summary(result)["best"]
    assert summary_best["engine"] == "vllm" and summary_best["gpuMemoryUtilizationPct"] == 80
    report = markdown(result, [])
    assert "| gpu_memory_utilization_pct | 80 |" in report


def test_an_adapter_maps_the_new_knob_with_one_line_and_refuses_to_drop_it_silently() -> None:
    argv = VllmWithShare().flags(config(gpu_memory_utilization_pct=80), "/m", "127.0.0.1", 8000)
    # The extension's flag comes after the declared knob's (argparse: the last one wins).
    assert argv[len(argv) - 1 - argv[::-1].index("--gpu-memory-utilization") + 1] == "0.8"
    with pytest.raises(AdapterError, match="honours knob 'gpu_memory_utilization_pct'"):
        VllmAdapter().flags(config(), "/m", "127.0.0.1", 8000)


def test_every_engine_adapter_maps_the_declared_knobs_it_honours() -> None:
    from infertune.tuner.engines import ADAPTERS

    for name, adapter in ADAPTERS.items():
        honoured = {k.name for k in SERVING_KNOBS.honoured_by(name)}
        assert set(adapter.knob_flags) == honoured, name
    assert set(VllmWithShare.knob_flags) == {k.name for k in KNOBS.honoured_by("vllm")}
    assert flag("--x")(3, config()) == ["--x", "3"]
