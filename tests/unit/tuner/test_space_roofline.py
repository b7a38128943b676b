"""The space keeps what each engine runs here, and the roofline prunes what cannot meet the SLO."""

from __future__ import annotations

from typing import Any

import pytest

from infertune.tuner.api import TuningSpec
from infertune.tuner.hardware import Hardware
from infertune.tuner.model_shape import from_config
from infertune.tuner.modelprofile import ModelProfile
from infertune.tuner.planning import prune_by_roofline, rank, seeds
from infertune.tuner.roofline import (
    Ceilings,
    StepModel,
    classify,
    decode_floor,
    predict,
    prefill_floor,
)
from infertune.tuner.space import build_space

TINY = from_config({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 4096, "max_position_embeddings": 2048,
})  # fmt: skip


def spec(**search: Any) -> TuningSpec:
    return TuningSpec.model_validate(
        {
            "model": {"uri": "builtin://tiny"},
            "slo": {"ttft": {"max": "500ms"}, "itl": {"max": "50ms"}},
            "traffic": {"rate": 4, "numRequests": 20},
            "search": {"engines": ["builtin"], **search},
        }
    )


def ceilings(bw_gbps: float = 10.0, flops: float = 1e11) -> Ceilings:
    return Ceilings("cpu", "test", "f", bw_gbps, {"fp32": flops, "bf16": flops}, 5.0)


def test_cpu_space_drops_cuda_graphs_and_gpu_only_engines(cpu: Hardware) -> None:
    s = build_space(spec(engines=["builtin", "sglang"], quantizations=["fp32", "int8"]), cpu)
    assert list(s.engines) == ["builtin"]
    assert s.engines["builtin"].cuda_graph == [False]
    pruned = {(p.engine, p.knob, str(p.value)) for p in s.pruned}
    assert ("builtin", "cudaGraph", "True") in pruned
    assert ("sglang", "engine", "sglang") in pruned
    assert s.size() == 2 * 6 * 4 * 2  # quants x seqs x tokens x blocks
    assert all(s.contains(c) for c in s.candidates())


def test_gpu_space_keeps_cuda_graphs(gpu: Hardware) -> None:
    s = build_space(spec(), gpu)
    assert sorted(s.engines["builtin"].cuda_graph) == [False, True]


def test_memory_floor_is_weights_over_bandwidth() -> None:
    c = ceilings(bw_gbps=1.0, flops=1e15)
    f = decode_floor(TINY, c, "fp32", 1, 0)
    assert f.bound == "memory"
    assert f.memory_ms == pytest.approx(TINY.read_bytes("fp32") / 1e9 * 1e3)
    # int4 reads about an eighth of the bytes, so its decode floor is about an eighth.
    assert decode_floor(TINY, c, "int4", 1, 0).floor_ms < f.floor_ms / 6
    assert prefill_floor(TINY, ceilings(bw_gbps=1e6, flops=1e9), "fp32", 512).bound == "compute"


def test_classification() -> None:
    floor = decode_floor(TINY, ceilings(), "fp32", 1, 64)
    assert classify(floor.floor_ms * 1.2, floor, launch_ms=0.01)[0] == "memory"
    bound, pct = classify(floor.floor_ms * 50, floor, launch_ms=floor.floor_ms * 40)
    assert bound == "launch" and pct == pytest.approx(2.0)
    assert classify(0.0, floor, None) == ("unknown", None)


def _profile(c: Ceilings) -> ModelProfile:
    return ModelProfile(hardware="test", ceilings=c, reference="fp32")


def test_precision_whose_decode_floor_exceeds_itl_is_pruned(cpu: Hardware) -> None:
    s = build_space(spec(quantizations=["fp32", "int4"]), cpu)
    # fp32 weights of the tiny model are ~21 MB: at 0.3 GB/s a decode step needs ~70ms > 50ms,
    # while int4 (~3 MB) needs ~10ms.
    prune_by_roofline(s, spec(), TINY, _profile(ceilings(bw_gbps=0.3, flops=1e12)))
    assert s.engines["builtin"].quantizations == ["int4"]
    (why,) = [p for p in s.pruned if p.rule == "roofline"]
    assert why.value == "fp32" and "decode floor" in why.reason and "50ms" in why.reason


def test_when_every_precision_is_hopeless_the_least_hopeless_stays(cpu: Hardware) -> None:
    s = build_space(spec(quantizations=["fp32", "int4"]), cpu)
    prune_by_roofline(s, spec(), TINY, _profile(ceilings(bw_gbps=0.001)))
    assert s.engines["builtin"].quantizations == ["int4"]


def test_prediction_saturates_when_batch_limit_is_too_small() -> None:
    step = StepModel(fixed_ms=20.0, per_token_ms=0.05)
    kw = dict(rate=8.0, concurrency=None, prompt_tokens=64, output_tokens=32)
    small = predict(step, max_num_seqs=1, max_num_batched_tokens=512, **kw)  # type: ignore[arg-type]
    big = predict(step, max_num_seqs=32, max_num_batched_tokens=512, **kw)  # type: ignore[arg-type]
    assert not small.stable and small.goodput_rps == 0
    assert big.stable and big.goodput_rps == 8.0


def test_seeds_are_the_best_predicted_and_distinct(cpu: Hardware) -> None:
    sp = spec(quantizations=["fp32", "int8"], maxNumSeqs={"values": [1, 8, 32]})
    s = build_space(sp, cpu)
    from infertune.tuner.modelprofile import PhaseResult, PrecisionProfile

    def prec(q: str, fixed: float) -> PrecisionProfile:
        ph = PhaseResult("decode", 1, fixed, 1, 1, 1, None, "memory", 10.0)
        return PrecisionProfile(q, 1, 1, 1, ph, ph, ph, StepModel(fixed, 0.01))

    prof = _profile(ceilings())
    prof.precisions = {"fp32": prec("fp32", 40.0), "int8": prec("int8", 10.0)}
    ranked = rank(s, sp, prof)
    assert ranked[0].config.quantization == "int8" and ranked[0].config.max_num_seqs >= 8
    chosen = seeds(s, sp, prof, 3)
    keys = {(c.config.quantization, c.config.max_num_seqs) for c in chosen}
    assert len(chosen) == 3 and len(keys) == 3


def _flat_profile(fixed: float, per_token: float) -> ModelProfile:
    from infertune.tuner.modelprofile import PhaseResult, PrecisionProfile

    ph = PhaseResult("decode", 1, fixed, 1, 1, 1, None, "memory", 10.0)
    prof = _profile(ceilings())
    step = StepModel(fixed, per_token)
    prof.precisions = {"fp32": PrecisionProfile("fp32", 1, 1, 1, ph, ph, ph, step)}
    return prof


def test_predicted_ties_prefer_batching_when_itl_has_room(cpu: Hardware) -> None:
    # A light load every batch limit can serve: goodput is predicted equal (the whole rate) for all.
    # The seeds must not be the unbatched max_num_seqs=1 (last session's tie-break did that).
    sp = spec(quantizations=["fp32"], maxNumSeqs={"values": [1, 4, 16]})
    s = build_space(sp, cpu)
    prof = _flat_profile(2.0, 0.001)
    ranked = rank(s, sp, prof)
    assert ranked[0].prediction.goodput_rps == ranked[-1].prediction.goodput_rps == 4.0
    assert ranked[0].config.max_num_seqs == 16
    assert [c.config.max_num_seqs for c in seeds(s, sp, prof, 3)] == [16, 4, 1]
    assert seeds(s, sp, prof, 1)[0].config.max_num_seqs == 16


def test_predicted_ties_prefer_lower_itl_when_itl_binds(cpu: Hardware) -> None:
    # A step takes ~41ms against a 50ms ITL bound: the ITL binds, so among tied configurations
    # the one with the lower predicted ITL comes first.
    sp = spec(quantizations=["fp32"], maxNumSeqs={"values": [8, 16, 32]})
    s = build_space(sp, cpu)
    ranked = rank(s, sp, _flat_profile(41.0, 0.02))
    tied = [r for r in ranked if r.score == ranked[0].score]
    assert len(tied) > 1 and all(r.prediction.itl_ms >= 0.8 * 50 for r in tied)
    itls = [r.prediction.itl_ms for r in tied]
    assert itls == sorted(itls)
    # Equal predicted ITL: the smaller prefill chunk first (it cannot lengthen a decode step).
    assert ranked[0].config.max_num_batched_tokens == min(
        sp.search.max_num_batched_tokens.candidates()
    )


def test_emulated_bf16_does_not_prune_packed_int4(cpu: Hardware) -> None:
    # An AVX2-only CPU: bf16 matmuls are emulated (~50x slower than fp32). int4 runs a packed
    # kernel, not a bf16 matmul, so its floor must not use the bf16 peak (it would prune int4
    # with a "floor" far above what the engine measures), while bf16 itself is rightly pruned.
    slow_bf16 = Ceilings("cpu", "test", "f", 10.0, {"fp32": 3e10, "bf16": 3e8}, 5.0)
    sp = spec(quantizations=["fp32", "bf16", "int4"])
    s = build_space(sp, cpu)
    prune_by_roofline(s, sp, TINY, _profile(slow_bf16))
    assert s.engines["builtin"].quantizations == ["fp32", "int4"]
    (why,) = [p for p in s.pruned if p.rule == "roofline"]
    assert why.value == "bf16" and "prefill floor" in why.reason


def test_a_floor_above_the_measured_time_does_not_prune(cpu: Hardware) -> None:
    # The bf16 ceiling was measured low (a busy machine): its "floor" for the prompt is above
    # what the profiler just measured for that very prompt, so it cannot prove the SLO hopeless.
    from infertune.tuner.modelprofile import PhaseResult, PrecisionProfile

    slow_bf16 = Ceilings("cpu", "test", "f", 10.0, {"fp32": 3e10, "bf16": 3e8}, 5.0)
    sp = spec(quantizations=["fp32", "bf16"])
    prompt = round(sp.traffic.prompt_tokens.expected)
    prefill = PhaseResult("prefill", prompt, 40.0, 1, 1, 1, None, "compute", 10.0)
    decode = PhaseResult("decode", 1, 5.0, 1, 1, 1, None, "memory", 10.0)
    prof = _profile(slow_bf16)
    step = StepModel(5.0, 0.3)
    prof.precisions = {"bf16": PrecisionProfile("bf16", 1, 1, 1, prefill, decode, decode, step)}
    s = build_space(sp, cpu)
    prune_by_roofline(s, sp, TINY, prof)
    assert s.engines["builtin"].quantizations == ["fp32", "bf16"]


def test_long_prompts_with_big_chunks_miss_a_p95_itl_their_mean_gap_meets() -> None:
    # 640-token prompts at 5/s: a step that carries a 512-token prefill chunk takes ~57 ms, and
    # such steps are far more than 5% of all steps, so p95 ITL is one of them, not the mean gap.
    step = StepModel(fixed_ms=6.0, per_token_ms=0.1)
    kw = dict(rate=5.0, concurrency=None, prompt_tokens=640, output_tokens=32, max_num_seqs=16)
    big = predict(step, max_num_batched_tokens=512, **kw)  # type: ignore[arg-type]
    small = predict(step, max_num_batched_tokens=64, **kw)  # type: ignore[arg-type]
    assert big.itl_ms < 50 < big.itl_at(95.0)
    assert small.itl_at(95.0) < 50
    assert big.prefill_share > 0.05
    # A p50 bound is the mean gap while fewer than half of the steps carry a chunk.
    assert big.prefill_share < 0.5 and big.itl_at(50.0) == big.itl_ms


def test_seed_planner_recalibrates_on_a_missed_seed(cpu: Hardware) -> None:
    # The profile times bare forward passes; served, every step here takes 3x as long. The first
    # seed (512-token chunks are predicted within the 50 ms ITL bound) misses it; recalibrated on
    # that measurement, the planner moves the next seed to smaller chunks, not to the next
    # precision or batch limit with the same chunk.
    from infertune.tuner.planning import SeedPlanner, calibrate, prediction_for

    sp = TuningSpec.model_validate(
        {
            "model": {"uri": "builtin://tiny"},
            "slo": {"ttft": {"max": "2s"}, "itl": {"max": "50ms", "percentile": "p95"}},
            "traffic": {"rate": 5, "promptTokens": {"mean": 640}, "outputTokens": {"mean": 32}},
            "search": {
                "engines": ["builtin"],
                "quantizations": ["fp32"],
                "maxNumSeqs": {"values": [8, 16]},
                "maxNumBatchedTokens": {"values": [64, 128, 256]},
            },
        }
    )
    s = build_space(sp, cpu)
    prof = _flat_profile(5.0, 0.06)
    planner = SeedPlanner(s, sp, prof, 3)
    first = planner.next({})
    assert first is not None and first.max_num_batched_tokens == 256
    p = prediction_for(first, sp, prof)
    served = {"itlP95Ms": 3 * p.itl_at(95.0), "ttftP95Ms": 3 * p.ttft_ms}
    assert served["itlP95Ms"] > 50  # the miss
    assert calibrate(sp, prof, {first: served}) == pytest.approx({"itl": 3.0, "ttft": 3.0})
    second = planner.next({first: served})
    assert second is not None and second.max_num_batched_tokens < 256
    assert 3 * prediction_for(second, sp, prof).itl_at(95.0) <= 50
    third = planner.next({first: served, second: served})
    assert third is not None and third not in (first, second)
    assert planner.next({}) is None  # three planned: the sampler takes over
    assert planner.planned == [first, second, third]
