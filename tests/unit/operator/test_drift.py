"""The keep-checking decisions: SLO windows, drift thresholds, hardware change, cooldown, rollout."""

from __future__ import annotations

from infertune.operator.api import Figures, Observation, RetunePolicy, ServingConfig
from infertune.operator.checking import material_change
from infertune.operator.drift import (
    RetuneTimers,
    beats_live,
    decide_retune,
    hardware_change,
    in_cooldown,
    observed_traffic,
    slo_check,
    traffic_drift,
    tuned_traffic,
)
from infertune.tuner.api import SLO, TrafficProfile
from infertune.tuner.gpu_identity import gpu_identity

POLICY = RetunePolicy.model_validate(
    {"checkInterval": "15s", "violationWindow": "30s", "cooldown": "1m"}
)
SLO_ = SLO.model_validate({"ttft": {"max": "300ms", "percentile": "p95"}, "itl": {"max": "50ms"}})


def cfg(**kw: object) -> ServingConfig:
    base: dict[str, object] = dict(engine="builtin", quantization="fp32", max_num_seqs=4, max_num_batched_tokens=256,
                                   kv_block_size=16, cuda_graph=False, config_hash="live")  # fmt: skip
    return ServingConfig.model_validate({**base, **kw})


def test_slo_check_names_each_violation() -> None:
    assert slo_check(SLO_, {"ttft": 250.0, "itl": 20.0}) == (True, [])
    met, violating = slo_check(SLO_, {"ttft": 412.0, "itl": 20.0})
    assert met is False and violating == ["ttft p95 412.0ms > 300ms"]
    assert slo_check(SLO_, {"ttft": None, "itl": None}) == (None, [])


def test_violation_must_hold_for_the_window() -> None:
    w = RetuneTimers()
    w.update(0, violated=True, drifted=None)
    w.update(15, violated=True, drifted=None)
    assert (
        decide_retune(POLICY, w, 15, violating=["x"], hardware=None, in_cooldown_now=False).reason
        is None
    )
    w.update(30, violated=True, drifted=None)
    assert (
        decide_retune(POLICY, w, 30, violating=["x"], hardware=None, in_cooldown_now=False).reason
        == "SLOViolation"
    )
    w.update(45, violated=False, drifted=None)  # one good window resets it
    assert (
        decide_retune(POLICY, w, 45, violating=[], hardware=None, in_cooldown_now=False).reason
        is None
    )
    w.update(50, violated=None, drifted=None)  # no traffic neither resets nor extends
    assert w.violating_since is None


def test_no_slo_retune_once_the_traffic_stopped() -> None:
    # The window held while traffic ran; then the traffic stops (no figures, nothing violating
    # now): that is no evidence for a retune (the demo's live check once retuned on it).
    w = RetuneTimers()
    for t in (0, 15, 30):
        w.update(t, violated=True, drifted=None)
    w.update(45, violated=None, drifted=None)
    assert (
        decide_retune(POLICY, w, 45, violating=[], hardware=None, in_cooldown_now=False).reason
        is None
    )


def test_drift_is_named_before_the_slo_miss_it_causes() -> None:
    # Longer prompts arrive and the ITL bound is missed with them: the reason is the drift (the
    # cause), and the message still carries the miss.
    w = RetuneTimers()
    for t in (0, 15, 30):
        w.update(t, violated=True, drifted=["promptTokens 2230 vs 640 (+248%)"])
    d = decide_retune(
        POLICY, w, 30, violating=["itl p95 58.4ms > 50ms"], hardware=None, in_cooldown_now=False
    )
    assert d.reason == "TrafficDrift"
    assert "promptTokens 2230" in d.message and "itl p95 58.4ms > 50ms" in d.message


def test_drift_beyond_thresholds_only() -> None:
    ref = tuned_traffic(
        None, TrafficProfile.model_validate({"rate": 8, "promptTokens": {"mean": 80}})
    )
    small = Figures(request_rate=9.0, prompt_tokens_mean=100.0, output_tokens_mean=64.0)
    assert traffic_drift(ref, small, POLICY) == []
    big = Figures(request_rate=8.0, prompt_tokens_mean=400.0, output_tokens_mean=64.0)
    out = traffic_drift(ref, big, POLICY)
    assert len(out) == 1 and out[0].startswith("promptTokens 400") and "+400%" in out[0]
    slow = Figures(request_rate=2.0, prompt_tokens_mean=80.0, output_tokens_mean=64.0)
    (rate,) = traffic_drift(ref, slow, POLICY)
    assert rate.startswith("rate 2 req/s per replica vs tuned 8") and "(-75% beyond" in rate


def test_tuned_reference_prefers_what_the_tuner_measured() -> None:
    traffic = TrafficProfile.model_validate({"concurrency": 4})
    live = cfg(measured={"requestRate": 3.5, "promptTokensMean": 500.0})
    ref = tuned_traffic(live, traffic)
    assert (ref.rate, ref.prompt_tokens, ref.output_tokens) == (3.5, 500.0, 64.0)


def test_hardware_change_is_immediate_and_first() -> None:
    h100, a100 = gpu_identity("NVIDIA-H100-80GB-HBM3"), gpu_identity("NVIDIA-A100-SXM4-80GB")
    assert h100 is not None and a100 is not None
    assert hardware_change(h100, {h100}) is None
    msg = hardware_change(h100, {a100})
    assert msg == "serving on NVIDIA-A100-SXM4-80GB but tuned on NVIDIA-H100-80GB-HBM3"
    w = RetuneTimers()
    w.update(0, violated=True, drifted=["rate"])
    d = decide_retune(POLICY, w, 100, violating=["x"], hardware=msg, in_cooldown_now=False)
    assert d.reason == "HardwareChanged"


def test_disabled_triggers_and_cooldown() -> None:
    policy = POLICY.model_copy(update={"triggers": ["TrafficDrift"]})
    w = RetuneTimers()
    w.update(0, violated=True, drifted=None)
    assert (
        decide_retune(
            policy, w, 100, violating=["x"], hardware="changed", in_cooldown_now=False
        ).reason
        is None
    )
    w.update(0, violated=None, drifted=["promptTokens"])
    d = decide_retune(policy, w, 100, violating=[], hardware=None, in_cooldown_now=True)
    assert d.reason == "TrafficDrift" and d.cooldown
    assert (
        in_cooldown(1000.0, 1030.0, 60.0)
        and not in_cooldown(1000.0, 1061.0, 60.0)
        and not in_cooldown(None, 1.0, 60.0)
    )
    off = POLICY.model_copy(update={"enabled": False})
    assert (
        decide_retune(off, w, 100, violating=[], hardware="x", in_cooldown_now=False).reason is None
    )


def test_observed_traffic_replaces_rate_and_lengths() -> None:
    base = TrafficProfile.model_validate({"concurrency": 4, "numRequests": 48})
    new = observed_traffic(
        base,
        Figures(request_rate=6.25, prompt_tokens_mean=410.0, output_tokens_mean=31.6),
        800.0,
        None,
    )
    assert new.rate == 6.25 and new.concurrency is None and new.num_requests == 48
    assert (
        new.prompt_tokens.distribution == "lognormal"
        and new.prompt_tokens.mean == 410
        and new.prompt_tokens.p95 == 800
    )
    assert new.output_tokens.distribution == "fixed" and new.output_tokens.mean == 32


def test_a_slower_observed_rate_shortens_the_request_count_not_beyond_twenty() -> None:
    # Tuned at 5/s with 40 requests (8 s a trial); live traffic runs at 1/s: 40 requests would
    # make every retune trial 40 s long, so the count follows the rate, down to 20.
    base = TrafficProfile.model_validate({"rate": 5, "numRequests": 40})
    slow = observed_traffic(base, Figures(request_rate=2.5), None, None)
    assert slow.rate == 2.5 and slow.num_requests == 20
    crawl = observed_traffic(base, Figures(request_rate=0.5), None, None)
    assert crawl.num_requests == 20
    fast = observed_traffic(base, Figures(request_rate=9.0), None, None)
    assert fast.num_requests == 40


def test_rollout_only_when_the_retune_beats_live() -> None:
    live = cfg()
    same = cfg(config_hash="live", slo_margins_ms={"ttft": 10.0})
    assert beats_live(same, live, None, [], SLO_, 0.05) == (
        False,
        "the retune chose the live configuration again",
    )
    better = cfg(
        config_hash="new",
        quantization="int8",
        measured={"goodputRps": 8.0, "ttftP95Ms": 250.0, "itlP95Ms": 20.0},
    )
    ok, why = beats_live(
        better, live, Figures(goodput_rps=5.0), ["ttft p95 400ms > 300ms"], SLO_, 0.05
    )
    assert ok and "meets the SLOs" in why
    ok, why = beats_live(better, live, Figures(goodput_rps=7.9), [], SLO_, 0.05)
    assert not ok and "gain below 5%" in why
    ok, _ = beats_live(better, live, Figures(goodput_rps=6.0), [], SLO_, 0.05)
    assert ok
    worse = cfg(
        config_hash="new", measured={"goodputRps": 9.0, "ttftP95Ms": 320.0, "itlP95Ms": 20.0}
    )
    assert not beats_live(worse, live, Figures(goodput_rps=6.0), [], SLO_, 0.05)[0]
    # A winner that never measured a bound is not taken to meet it.
    unmeasured = cfg(config_hash="new", measured={"goodputRps": 9.0, "ttftP95Ms": 250.0})
    assert not beats_live(unmeasured, live, Figures(goodput_rps=6.0), [], SLO_, 0.05)[0]


def test_steady_observations_are_not_rewritten() -> None:
    a = Observation(
        time="t0",
        source="scrape",
        figures=Figures(ttft_p95_ms=100.0, request_rate=8.0),
        slo_met=True,
    )
    assert not material_change(
        a,
        a.model_copy(
            update={"time": "t1", "figures": Figures(ttft_p95_ms=105.0, request_rate=8.3)}
        ),
    )
    assert material_change(
        a, a.model_copy(update={"figures": Figures(ttft_p95_ms=130.0, request_rate=8.0)})
    )
    assert material_change(a, a.model_copy(update={"slo_met": False, "violating": ["ttft"]}))
    assert material_change(None, a)


def test_nvml_result_on_a_gfd_labelled_node_is_no_hardware_change() -> None:
    # The tuner's summary names the GPU as NVML does; the node carries GFD's labels (MiB memory).
    from infertune.tuner.gpu_identity import from_node_labels, from_nvml
    from infertune.tuner.result import TuningResult, compact_summary

    result = TuningResult(
        study="s", status="failed", reason="", objective="goodput", slo={}, trials=[],
        trials_total=1,
        hardware={"kind": "gpu", "product": "NVIDIA H100 80GB HBM3", "memory_bytes": 81559 * 2**20},
    )  # fmt: skip
    summary = compact_summary(result)
    tuned = gpu_identity(summary["gpuProduct"], summary["gpuMemoryMib"])
    node = from_node_labels(
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
    )
    assert tuned is not None and node is not None
    assert hardware_change(tuned, {node}) is None
    # Time-slicing's -SHARED suffix is the same GPU; old statuses with NVML's name still match.
    shared = from_node_labels({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED"})
    assert shared is not None and hardware_change(tuned, {shared}) is None
    assert hardware_change(gpu_identity("NVIDIA H100 80GB HBM3"), {node}) is None
    # A real change: another product, or the same name with another memory size.
    pcie = from_node_labels({"nvidia.com/gpu.product": "NVIDIA-H100-PCIe"})
    assert pcie is not None
    assert hardware_change(tuned, {node, pcie}) == (
        "serving on NVIDIA-H100-PCIe but tuned on NVIDIA-H100-80GB-HBM3 (80 GiB)"
    )
    small = from_nvml("NVIDIA H100 80GB HBM3", 40 * 2**30)
    assert small is not None and hardware_change(tuned, {small}) is not None


def test_three_replicas_at_three_times_a_pods_share_is_no_drift() -> None:
    from infertune.operator.builders.job import pod_tuning_spec
    from infertune.tuner.api import TuningSpec

    spec = TuningSpec.model_validate(
        {"model": {"uri": "builtin://tiny"}, "slo": {"ttft": {"max": "1s"}},
         "traffic": {"rate": 30, "numRequests": 60}}
    )  # fmt: skip
    # Trials load one replica with its share of the service's total rate.
    assert pod_tuning_spec(spec, 3).traffic.rate == 10
    assert pod_tuning_spec(spec, 0).traffic.rate == 30
    live = cfg(measured={"requestRate": 10.0, "promptTokensMean": 128.0, "outputTokensMean": 64.0})
    seen = Figures(request_rate=30.0, prompt_tokens_mean=128.0, output_tokens_mean=64.0)
    assert traffic_drift(tuned_traffic(live, spec.traffic, 3), seen, POLICY, replicas=3) == []
    # Without a measurement, the spec's total is shared among the replicas too.
    assert traffic_drift(tuned_traffic(None, spec.traffic, 3), seen, POLICY, replicas=3) == []
    # The same total on one pod is three times its share: drift.
    assert traffic_drift(tuned_traffic(live, spec.traffic, 3), seen, POLICY, replicas=1)
