"""Every pod the operator makes: pull secrets and service account (the chart's and the service's),
each engine's user, root filesystem and caches from its row of the runtime table, default engine
images that are the versions the tuner measures with, and probes timed by the measured start-up
and /health latency under load."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes_validate import validate
from operator_samples import ROOT, demo_doc, isvc_from
from test_builders import K8S_VERSION, plan_for, pod_spec

from infertune.operator.api import ServingConfig
from infertune.operator.builders import desired_deployment, desired_job
from infertune.operator.builders.probes import probe_timing
from infertune.operator.engine_runtime import CACHE_DIR, ENGINE_RUNTIMES
from infertune.operator.settings import DEFAULT_ENGINE_IMAGES, OperatorSettings, parse_settings
from infertune.operator.summary import parse_summary


def _config(engine: str, **extra: Any) -> ServingConfig:
    return ServingConfig(
        engine=engine,
        quantization="bf16" if engine != "llamacpp" else "int8",
        max_num_seqs=16,
        max_num_batched_tokens=512,
        kv_block_size=16,
        cuda_graph=False,
        **extra,
    )


def _pods(settings: OperatorSettings, **spec: Any) -> list[dict[str, Any]]:
    """The pod specs of every kind the operator creates: stable, canary (with the GGUF init
    container, llama.cpp) and the tuning Job."""
    isvc = isvc_from(demo_doc(**spec))
    return [
        pod_spec(desired_deployment(isvc, _config("vllm"), settings)),
        pod_spec(desired_deployment(isvc, _config("llamacpp"), settings, track="canary")),
        pod_spec(desired_job(isvc, plan_for(isvc), settings)),
    ]


def test_every_pod_carries_the_chart_and_the_service_pull_secrets() -> None:
    settings, _ = parse_settings(["--image-pull-secret", "mirror", "--image-pull-secret", "mirror"])
    pods = _pods(settings, imagePullSecrets=[{"name": "team-registry"}, {"name": "mirror"}])
    assert any("initContainers" in p for p in pods)
    for pod in pods:
        assert pod["imagePullSecrets"] == [{"name": "mirror"}, {"name": "team-registry"}]


def test_pull_secrets_without_the_chart_and_none_at_all() -> None:
    for pod in _pods(OperatorSettings(), imagePullSecrets=[{"name": "own"}]):
        assert pod["imagePullSecrets"] == [{"name": "own"}]
    for pod in _pods(OperatorSettings()):
        assert "imagePullSecrets" not in pod


def test_serving_pods_run_as_the_services_account_tuning_pods_as_the_tuners() -> None:
    settings = OperatorSettings(tuning_service_account="it-tuner")
    stable, canary, job = _pods(settings, serviceAccountName="llama-serving")
    assert stable["serviceAccountName"] == canary["serviceAccountName"] == "llama-serving"
    assert job["serviceAccountName"] == "it-tuner"
    assert all(p["automountServiceAccountToken"] is False for p in (stable, canary, job))


@pytest.mark.parametrize("engine", sorted(ENGINE_RUNTIMES))
def test_engine_pod_follows_its_runtime_row(engine: str) -> None:
    rt = ENGINE_RUNTIMES[engine]
    isvc = isvc_from(demo_doc())
    deployment = desired_deployment(isvc, _config(engine), OperatorSettings())
    validate(deployment, K8S_VERSION, strict=True)
    pod = pod_spec(deployment)
    engine_c = next(c for c in pod["containers"] if c["name"] == "engine")
    sc = engine_c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["readOnlyRootFilesystem"] is rt.read_only_root_filesystem
    if rt.run_as_user is None:  # the image needs root: nothing claims otherwise
        assert sc["runAsNonRoot"] is False and "runAsUser" not in sc
        assert "runAsUser" not in pod["securityContext"]
    else:
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == rt.run_as_user
    mounts = {m["mountPath"] for m in engine_c["volumeMounts"]}
    assert set(rt.writable_paths) <= mounts
    assert ("/dev/shm" in mounts) is rt.shm
    env = {e["name"]: e.get("value") for e in engine_c["env"]}
    assert env["HOME"] == rt.home
    for key, value in rt.env.items():
        assert env[key] == value
    if "HF_HOME" in env:
        assert env["HF_HOME"].startswith(CACHE_DIR) and CACHE_DIR in mounts
    # The init container runs the project's tuner image: its own uid and a read-only root.
    for init in pod.get("initContainers", []):
        assert init["securityContext"]["runAsUser"] == 65532
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
        names = {v["name"] for v in pod["volumes"]}
        assert {m["name"] for m in init["volumeMounts"]} <= names


def test_upstream_images_are_not_forced_to_uid_65532_and_a_read_only_root() -> None:
    for engine in ("vllm", "sglang"):
        pod = pod_spec(
            desired_deployment(isvc_from(demo_doc()), _config(engine), OperatorSettings())
        )
        sc = pod["containers"][0]["securityContext"]
        assert sc["readOnlyRootFilesystem"] is False and sc.get("runAsUser") != 65532


def test_runtime_rows_are_overridden_by_settings() -> None:
    settings, _ = parse_settings(
        [
            "--engine-runtime",
            'vllm={"runAsUser": 65532, "readOnlyRootFilesystem": true, "home": "/tmp"}',
        ]
    )
    pod = pod_spec(desired_deployment(isvc_from(demo_doc()), _config("vllm"), settings))
    sc = pod["containers"][0]["securityContext"]
    assert sc["runAsUser"] == 65532 and sc["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["fsGroup"] == 65532
    with pytest.raises(SystemExit):
        parse_settings(["--engine-runtime", 'vllm={"runAsUsr": 1}'])


def test_default_engine_images_are_the_versions_the_tuner_measures_with() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile.tuner").read_text()
    vllm = re.search(r"vllm==([0-9.]+)", dockerfile)
    sglang = re.search(r"sglang\[all\]==([0-9.]+)", dockerfile)
    assert vllm and sglang
    assert DEFAULT_ENGINE_IMAGES["vllm"] == f"vllm/vllm-openai:v{vllm.group(1)}"
    assert DEFAULT_ENGINE_IMAGES["sglang"] == f"lmsysorg/sglang:v{sglang.group(1)}"
    for image in DEFAULT_ENGINE_IMAGES.values():  # no registry host: the chart or a mirror decides
        assert "." not in image.split("/")[0] or "/" not in image


def test_probe_timing_derives_from_startup_and_health_latency() -> None:
    slow = probe_timing(startup_s=400.0, health_ms=4000.0)
    live, ready, start = slow["livenessProbe"], slow["readinessProbe"], slow["startupProbe"]
    assert ready["timeoutSeconds"] == 8 and live["timeoutSeconds"] == 20
    # Liveness tolerates two minutes of failing /health; readiness reacts in 15 s.
    assert live["periodSeconds"] * live["failureThreshold"] >= 120
    assert ready["periodSeconds"] * ready["failureThreshold"] <= 15
    assert start["periodSeconds"] * start["failureThreshold"] >= 3 * 400
    fast = probe_timing(startup_s=5.0, health_ms=3.0)
    assert fast["readinessProbe"]["timeoutSeconds"] == 2
    assert fast["livenessProbe"]["timeoutSeconds"] == 10  # never the kubelet's 1 s
    assert fast["startupProbe"]["periodSeconds"] * fast["startupProbe"]["failureThreshold"] >= 300
    unknown = probe_timing(None, None)
    assert unknown["livenessProbe"]["timeoutSeconds"] >= 10
    huge = probe_timing(startup_s=1e6, health_ms=1e7)
    assert huge["livenessProbe"]["timeoutSeconds"] == 60
    assert huge["startupProbe"]["periodSeconds"] * huge["startupProbe"]["failureThreshold"] == 3600


def test_deployment_probes_use_the_winners_measurements() -> None:
    summary = parse_summary(
        '{"version":1,"status":"succeeded","best":{"engine":"vllm","quantization":"bf16",'
        '"maxNumSeqs":16,"maxNumBatchedTokens":512,"kvBlockSize":16,"cudaGraph":false,'
        '"startupS":90.5,"healthLatencyMs":2500.0}}'
    )
    assert not isinstance(summary, str)
    config = summary.serving_config()
    assert config is not None and config.startup_s == 90.5 and config.health_latency_ms == 2500.0
    pod = pod_spec(desired_deployment(isvc_from(demo_doc()), config, OperatorSettings()))
    c = pod["containers"][0]
    want = probe_timing(90.5, 2500.0)
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[name]["httpGet"] == {"path": "/health", "port": "http"}
        assert {k: v for k, v in c[name].items() if k != "httpGet"} == want[name]
    assert c["livenessProbe"]["timeoutSeconds"] > c["readinessProbe"]["timeoutSeconds"] > 1
