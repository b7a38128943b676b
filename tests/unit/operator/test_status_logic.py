"""Conditions, phase, hashes, the tuner's summary and the classify/merge-patch helpers."""

from __future__ import annotations

import json

import pytest
from operator_samples import demo_doc, isvc_from

from infertune.operator.api import InferenceServiceStatus, ServingConfig
from infertune.operator.builders.common import ANN_DESIRED
from infertune.operator.conditions import derive_phase, derive_ready, get_condition, set_condition
from infertune.operator.hashing import tuning_hash
from infertune.operator.reconcile import classify, merge_patch
from infertune.operator.summary import Summary, parse_summary

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def test_transition_time_moves_only_when_the_status_flips() -> None:
    conds = set_condition([], "Tuned", "Unknown", "Tuning", "job a", now=T0)
    conds = set_condition(conds, "Tuned", "Unknown", "Tuning", "job b", now=T1)
    tuned = get_condition(conds, "Tuned")
    assert tuned is not None and tuned.last_transition_time == T0 and tuned.message == "job b"
    conds = set_condition(conds, "Tuned", "True", "Tuned", "best", now=T1)
    tuned = get_condition(conds, "Tuned")
    assert tuned is not None and tuned.last_transition_time == T1


def test_ready_and_phase_follow_the_story() -> None:
    st = InferenceServiceStatus()
    st.conditions = set_condition([], "Tuned", "Unknown", "Tuning", now=T0)
    st.conditions = derive_ready(st.conditions, now=T0, generation=1)
    assert get_condition(st.conditions, "Ready").status == "Unknown"  # type: ignore[union-attr]
    assert derive_phase(st) == "Tuning"
    st.conditions = set_condition(st.conditions, "Tuned", "True", "Tuned", now=T0)
    st.conditions = set_condition(st.conditions, "RolledOut", "Unknown", "RollingOut", now=T0)
    assert derive_phase(st) == "RollingOut"
    st.conditions = set_condition(st.conditions, "RolledOut", "True", "Available", "1/1", now=T1)
    st.conditions = derive_ready(st.conditions, now=T1, generation=1)
    assert get_condition(st.conditions, "Ready").status == "True"  # type: ignore[union-attr]
    assert derive_phase(st) == "Serving"
    st.conditions = set_condition(st.conditions, "SLOMet", "False", "SLOViolated", now=T1)
    assert derive_phase(st) == "Degraded"
    st.live = ServingConfig(engine="builtin", quantization="fp32", max_num_seqs=1, max_num_batched_tokens=1,
                            kv_block_size=16, cuda_graph=False)  # fmt: skip
    st.conditions = set_condition(st.conditions, "Tuned", "Unknown", "Tuning", now=T1)
    assert derive_phase(st) == "Retuning"


def test_failed_tuning_makes_ready_false_with_the_reason() -> None:
    conds = set_condition([], "Tuned", "False", "TuningFailed", "OOM in trial 3", now=T0)
    conds = derive_ready(conds, now=T0, generation=2)
    ready = get_condition(conds, "Ready")
    assert ready is not None and (ready.status, ready.reason, ready.message) == (
        "False",
        "TuningFailed",
        "OOM in trial 3",
    )


def test_invalid_spec_stays_until_a_new_generation() -> None:
    conds = set_condition(
        [], "Ready", "False", "InvalidSpec", "spec.slo: ...", now=T0, generation=3
    )
    assert derive_ready(conds, now=T1, generation=3) == conds
    fresh = derive_ready(conds, now=T1, generation=4)
    assert get_condition(fresh, "Ready").reason != "InvalidSpec"  # type: ignore[union-attr]


def test_only_tuning_relevant_changes_move_the_tuning_hash() -> None:
    base = tuning_hash(isvc_from(demo_doc()).spec)
    assert tuning_hash(isvc_from(demo_doc(rollout={"replicas": 5})).spec) == base
    assert (
        tuning_hash(
            isvc_from(demo_doc(retune={"checkInterval": "2m", "violationWindow": "4m"})).spec
        )
        == base
    )
    assert (
        tuning_hash(isvc_from(demo_doc(slo__ttft={"max": "250ms", "percentile": "p95"})).spec)
        != base
    )
    assert tuning_hash(isvc_from(demo_doc(hardware__gpuProducts=["Tesla-T4"])).spec) != base
    assert tuning_hash(isvc_from(demo_doc(traffic__rate=16)).spec) != base


SUMMARY = {
    "version": 1, "status": "succeeded", "reason": "", "study": "ns-x-12345678",
    "trialsCompleted": 9, "trialsTotal": 10, "hardware": "cpu", "gpuProduct": None,
    "best": {"engine": "builtin", "quantization": "int8", "maxNumSeqs": 16, "maxNumBatchedTokens": 512,
             "kvBlockSize": 16, "cudaGraph": False,
             "measured": {"ttftP95Ms": 120.5, "e2eP99Ms": 900.0, "goodputRps": 7.5, "requestRate": 8.0, "promptTokensMean": 80.0},
             "sloMarginsMs": {"ttft": 379.5}},
    "bindingConstraint": None,
    "profile": {"hardware": "cpu", "memoryBandwidthGbps": 20.0, "peakTflops": 0.5,
                "prefill": {"bound": "compute", "measuredMs": 4.0, "rooflineFloorMs": 2.0, "percentOfRoofline": 50.0},
                "decode": {"bound": "memory"}},
}  # fmt: skip


def test_summary_maps_onto_the_status_models() -> None:
    parsed = parse_summary(json.dumps(SUMMARY))
    assert isinstance(parsed, Summary)
    config = parsed.serving_config()
    assert config is not None and config.quantization == "int8" and config.max_num_seqs == 16
    assert config.measured is not None and config.measured.ttft_p95_ms == 120.5
    assert config.measured.e2e_p99_ms == 900.0  # the contract writes e2eP99Ms
    assert config.slo_margins_ms == {"ttft": 379.5}
    profile = parsed.status_profile()
    assert (
        profile is not None and profile.prefill is not None and profile.prefill.bound == "compute"
    )
    assert len(json.dumps(SUMMARY)) <= 4096


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (None, "no termination message"),
        (
            "Traceback...\nRuntimeError: CUDA out of memory",
            "last log line: RuntimeError: CUDA out of memory",
        ),
        (json.dumps({**SUMMARY, "version": 2}), "version 2 is not supported"),
        (json.dumps({**SUMMARY, "status": "done"}), "malformed at status"),
    ],
)
def test_unusable_messages_become_a_reason(message: str | None, expected: str) -> None:
    parsed = parse_summary(message)
    assert isinstance(parsed, str) and expected in parsed


def test_classify_compares_the_desired_hash_only() -> None:
    desired = {
        "kind": "Service",
        "metadata": {"name": "a", "namespace": "n", "annotations": {ANN_DESIRED: "h1"}},
    }
    assert classify(desired, None).verb == "create"
    server_side = {
        "metadata": {"annotations": {ANN_DESIRED: "h1"}, "resourceVersion": "9"},
        "spec": {"clusterIP": "10.0.0.3"},
    }
    assert classify(desired, server_side).verb == "unchanged"
    assert classify(desired, {"metadata": {"annotations": {ANN_DESIRED: "h0"}}}).verb == "update"


def test_merge_patch_is_minimal_and_removes_keys() -> None:
    old = {
        "phase": "Tuning",
        "tuning": {"job": "a", "trialsTotal": 10},
        "conditions": [1, 2],
        "x": 1,
    }
    new = {"phase": "Serving", "tuning": {"job": "a", "trialsTotal": 10}, "conditions": [1, 2, 3]}
    assert merge_patch(old, new) == {"phase": "Serving", "conditions": [1, 2, 3], "x": None}
    assert merge_patch(new, new) is None
