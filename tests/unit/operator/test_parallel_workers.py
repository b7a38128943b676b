"""budget.parallelTrials on the cluster: the tuning Job runs N workers on one study, and a spec
asking for workers this operator cannot give a shared storage is refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_validate import validate
from operator_samples import demo_doc, isvc_from

from infertune.operator.builders import RunPlan, desired_job
from infertune.operator.builders.job import pod_tuning_spec
from infertune.operator.context import InvalidSpecError, load
from infertune.operator.hashing import run_hash, tuning_hash
from infertune.operator.settings import OperatorSettings
from infertune.operator.tuning_run import _job_pod
from infertune.operator.validation import storage_problems

SHARED = OperatorSettings(storage_secret="infertune-postgresql")


def job(settings: OperatorSettings = SHARED, gpu: str | None = None, **changes: Any) -> Any:
    isvc = isvc_from(demo_doc(**changes))
    tuning = pod_tuning_spec(isvc.spec.tuning_spec())
    plan = RunPlan(run_id="0123abcd", spec_hash=tuning_hash(isvc.spec),
                   run_hash=run_hash(tuning, gpu), reason="Created", tuning=tuning,
                   gpu_product=gpu)  # fmt: skip
    return desired_job(isvc, plan, settings)


def test_one_worker_keeps_the_plain_job() -> None:
    j = job()
    assert "parallelism" not in j["spec"] and "completions" not in j["spec"]
    assert "--workers" not in j["spec"]["template"]["spec"]["containers"][0]["command"]
    assert set(j["spec"]["template"]["spec"]["affinity"]) == {"nodeAffinity"}


def test_parallel_trials_run_n_worker_pods_on_one_study() -> None:
    j = job(budget={"maxTrials": 8, "parallelTrials": 3},
            hardware={"gpuProducts": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"], "gpusPerReplica": 1})  # fmt: skip
    validate(j, "1.25.0", strict=True)
    spec = j["spec"]
    assert spec["parallelism"] == spec["completions"] == 3
    pod = spec["template"]["spec"]
    argv = pod["containers"][0]["command"]
    assert argv[argv.index("--workers") + 1] == "3"
    # One study for all: the same --study-name and storage URL in every pod (one template).
    assert "$(INFERTUNE_STORAGE_URL)" in argv
    labels = spec["template"]["metadata"]["labels"]
    selector = {"infertune.dev/run": "0123abcd", "infertune.dev/inferenceservice": labels["infertune.dev/inferenceservice"]}  # fmt: skip
    assert all(labels[k] == v for k, v in selector.items())
    spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread[0]["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": selector},
        "topologyKey": "kubernetes.io/hostname",
    }
    # Several products allowed: the workers still share one (a study compares like with like).
    same = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert same == [{"labelSelector": {"matchLabels": selector}, "topologyKey": "nvidia.com/gpu.product"}]  # fmt: skip
    assert "nodeAffinity" in pod["affinity"]  # the product rule is kept
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"  # a GPU each


def test_a_pinned_product_needs_no_pod_affinity() -> None:
    j = job(gpu="NVIDIA-H100-80GB-HBM3", budget={"maxTrials": 8, "parallelTrials": 2})
    assert "podAffinity" not in j["spec"]["template"]["spec"]["affinity"]
    assert "podAntiAffinity" in j["spec"]["template"]["spec"]["affinity"]


def test_parallel_trials_without_shared_storage_is_an_invalid_spec() -> None:
    doc = demo_doc(budget={"maxTrials": 8, "parallelTrials": 2})
    isvc = isvc_from(doc)
    assert storage_problems(isvc.spec, shared_storage=True) == []
    (why,) = storage_problems(isvc.spec, shared_storage=False)
    assert "parallelTrials: 2" in why and "SQLite" in why and "storage.type=postgresql" in why

    class Rt:
        settings = OperatorSettings()

    with pytest.raises(InvalidSpecError, match="no shared study storage"):
        load(Rt(), doc)  # type: ignore[arg-type]
    Rt.settings = SHARED
    assert load(Rt(), doc).isvc.spec.budget.parallel_trials == 2  # type: ignore[arg-type]


def test_the_run_summary_comes_from_a_succeeded_worker() -> None:
    pods = [
        {"job": "j", "terminated": True, "phase": "Succeeded", "finished_at": "2026-01-01T10:00:00Z", "message": "a"},
        {"job": "j", "terminated": True, "phase": "Succeeded", "finished_at": "2026-01-01T10:00:05Z", "message": "b"},
        # A lost worker whose pod was only reaped later: its message is a log tail.
        {"job": "j", "terminated": True, "phase": "Failed", "finished_at": "2026-01-01T10:01:00Z", "message": "log"},
    ]  # fmt: skip
    pod = _job_pod(pods, "j")
    assert pod is not None and pod["message"] == "b"
