"""hf:// models on a cluster: the fetch-model init step, the model cache volume, the token by
reference, the revision rules, and a failed fetch turned into a condition that names the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from operator_samples import demo_doc, isvc_from
from test_builders import plan_for, pod_spec

from infertune.operator.api import InferenceService, ServingConfig
from infertune.operator.builders.deployment import desired_deployment, serving_argv
from infertune.operator.builders.job import desired_job
from infertune.operator.hashing import tuning_hash
from infertune.operator.model_fetch import describe_failure, fetch_failure, fetched_bytes
from infertune.operator.pods import pod_summary
from infertune.operator.settings import OperatorSettings, parse_settings
from infertune.operator.validation import spec_problems
from infertune.tuner.fetch_cli import EXIT_PERMANENT, EXIT_TRANSIENT

COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
KNOBS: dict[str, Any] = {
    "max_num_seqs": 16,
    "max_num_batched_tokens": 4096,
    "kv_block_size": 16,
    "cuda_graph": False,
}


def hf_isvc(**model: Any) -> InferenceService:
    fields = {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", **model}
    return isvc_from(demo_doc(**{f"model__{k}": v for k, v in fields.items()}))


def init_of(obj: dict[str, Any]) -> dict[str, Any]:
    (init,) = [c for c in pod_spec(obj).get("initContainers", []) if c["name"] == "fetch-model"]
    return init


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_the_job_fetches_once_into_the_cache_and_the_tuner_reads_it_there() -> None:
    isvc = hf_isvc(revision=COMMIT, tokenSecret={"name": "hf-token"})
    settings = OperatorSettings(hf_endpoint="http://mirror.internal:8080")
    job = desired_job(isvc, plan_for(isvc), settings)
    init = init_of(job)
    uri = f"hf://meta-llama/Llama-3.1-8B-Instruct@{COMMIT}"  # model.revision pinned in the URI
    assert init["command"] == [
        "infertune", "fetch-model", uri, "--termination-message", "/dev/termination-log",
    ]  # fmt: skip
    env = env_of(init)
    # The token by reference only: optional, so a missing Secret is a refused fetch with a
    # condition, not a pod stuck in CreateContainerConfigError; never on the command line.
    assert env["HF_TOKEN"] == {
        "secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}
    }
    assert not any("token" in arg.lower() for arg in init["command"][2:] if arg != uri)
    assert env["HF_ENDPOINT"] == "http://mirror.internal:8080"
    assert env["INFERTUNE_MODEL_CACHE"] == "/mnt/model-cache"
    sc = init["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert not sc["allowPrivilegeEscalation"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert init["terminationMessagePath"] == "/dev/termination-log"
    assert {"name": "model-cache", "mountPath": "/mnt/model-cache"} in init["volumeMounts"]
    tuner = pod_spec(job)["containers"][0]
    assert env_of(tuner)["INFERTUNE_MODEL_CACHE"] == "/mnt/model-cache"
    assert "HF_TOKEN" not in env_of(tuner)  # only the fetch step holds the token
    assert {"name": "model-cache", "mountPath": "/mnt/model-cache", "readOnly": True} in tuner[
        "volumeMounts"
    ]
    # Every mount of the init step has its volume in the pod.
    names = {v["name"] for v in pod_spec(job)["volumes"]}
    assert {m["name"] for m in init["volumeMounts"]} <= names
    # A missing repository, revision or token fails the Job at once (1.26+).
    rule = job["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {
        "containerName": "fetch-model", "operator": "In", "values": [EXIT_PERMANENT],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("cache", "settings", "volume"),
    [
        ({"claimName": "weights"}, {}, {"persistentVolumeClaim": {"claimName": "weights"}}),
        (None, {"model_cache_claim": "shared"}, {"persistentVolumeClaim": {"claimName": "shared"}}),
        ({"size": "40Gi"}, {"model_cache_claim": None}, {"emptyDir": {"sizeLimit": "40Gi"}}),
        (None, {"model_cache_size": "20Gi"}, {"emptyDir": {"sizeLimit": "20Gi"}}),
        (None, {}, {"emptyDir": {}}),
    ],
)
def test_the_cache_is_the_specs_claim_else_the_charts_else_a_sized_emptydir(
    cache: dict[str, str] | None, settings: dict[str, str], volume: dict[str, Any]
) -> None:
    isvc = hf_isvc(**({"cache": cache} if cache else {}))
    job = desired_job(isvc, plan_for(isvc), OperatorSettings(**settings))
    (vol,) = [v for v in pod_spec(job)["volumes"] if v["name"] == "model-cache"]
    assert {k: v for k, v in vol.items() if k != "name"} == volume


def test_the_deployment_serves_the_cached_directory_never_the_hf_uri() -> None:
    isvc = hf_isvc(revision="v2", tokenSecret={"name": "hf", "key": "HF_TOKEN"})
    for engine, flag in (("vllm", "--model"), ("sglang", "--model-path"), ("builtin", "--model")):
        config = ServingConfig(engine=engine, quantization="bf16", **KNOBS)
        argv = serving_argv(isvc, config, OperatorSettings())
        path = argv[argv.index(flag) + 1]
        assert path == "/mnt/model-cache/hf/meta-llama/Llama-3.1-8B-Instruct/v2", engine
        assert not any(a.startswith("hf://") for a in argv)
        dep = desired_deployment(isvc, config, OperatorSettings())
        spec = pod_spec(dep)
        assert init_of(dep)["command"][2] == "hf://meta-llama/Llama-3.1-8B-Instruct@v2"
        engine_mounts = spec["containers"][0]["volumeMounts"]
        assert {"name": "model-cache", "mountPath": "/mnt/model-cache", "readOnly": True} in (
            engine_mounts
        )
        # The fetch writes as the project's user; a claim becomes group-writable by fsGroup,
        # also under an engine image that runs as root.
        assert spec["securityContext"]["fsGroup"] == 65532


def test_llamacpp_converts_after_the_fetch() -> None:
    isvc = hf_isvc()
    config = ServingConfig(engine="llamacpp", quantization="int8", **KNOBS)
    spec = pod_spec(desired_deployment(isvc, config, OperatorSettings()))
    names = [c["name"] for c in spec["initContainers"]]
    assert names == ["fetch-model", "gguf"]
    gguf = spec["initContainers"][1]
    model = gguf["command"][gguf["command"].index("--model") + 1]
    assert model == "/mnt/model-cache/hf/meta-llama/Llama-3.1-8B-Instruct/main"
    assert any(m["mountPath"] == "/mnt/model-cache" for m in gguf["volumeMounts"])


def test_pvc_and_file_models_get_no_fetch_step() -> None:
    for uri in ("pvc://models/llama", "/models/llama", "builtin://tiny"):
        isvc = isvc_from(demo_doc(model__uri=uri))
        job = desired_job(isvc, plan_for(isvc), OperatorSettings())
        assert "initContainers" not in pod_spec(job) and "podFailurePolicy" not in job["spec"]
        assert all(v["name"] != "model-cache" for v in pod_spec(job)["volumes"])


def test_hf_variants_are_fetched_by_the_tuning_job() -> None:
    variants = {"int4": {"uri": "hf://org/llama-AWQ@v1", "method": "awq"}}
    isvc = isvc_from(demo_doc(model__uri="pvc://models/llama", model__variants=variants))
    assert init_of(desired_job(isvc, plan_for(isvc), OperatorSettings()))["command"][2:3] == [
        "hf://org/llama-AWQ@v1"
    ]


def test_revision_rules_name_both_fields() -> None:
    problems = spec_problems(
        {**demo_doc()["spec"], "model": {"uri": "hf://org/m@v1", "revision": "v2"}}
    )
    assert problems and "model.revision" in problems[0] and "model.uri" in problems[0]
    assert (
        spec_problems({**demo_doc()["spec"], "model": {"uri": "hf://org/m@v1", "revision": "v1"}})
        == []
    )
    for wrong in (
        {"uri": "pvc://m/x", "revision": "v1"},
        {"uri": "/x", "tokenSecret": {"name": "s"}},
    ):
        (problem,) = spec_problems({**demo_doc()["spec"], "model": wrong})
        assert problem.startswith("spec.model") and "hf://" in problem, problem
    (bad,) = spec_problems({**demo_doc()["spec"], "model": {"uri": "hf://org/a/b"}})
    assert bad.startswith("spec.model.uri")


def test_a_new_token_or_cache_never_retunes() -> None:
    base = hf_isvc()
    other = hf_isvc(tokenSecret={"name": "other"}, cache={"claimName": "c"})
    assert tuning_hash(base.spec) == tuning_hash(other.spec)
    assert "tokenSecret" not in json.dumps(other.spec.tuning_spec().to_wire())
    assert tuning_hash(base.spec) != tuning_hash(hf_isvc(revision="v3").spec)


def test_the_chart_flags_reach_the_settings() -> None:
    settings, _ = parse_settings(
        ["--model-cache-claim", "models", "--model-cache-size", "50Gi", "--hf-endpoint", "http://m"]
    )
    assert (settings.model_cache_claim, settings.model_cache_size, settings.hf_endpoint) == (
        "models", "50Gi", "http://m",
    )  # fmt: skip


def failed_pod(message: dict[str, Any] | str, code: int) -> dict[str, Any]:
    term = {
        "exitCode": code,
        "message": message if isinstance(message, str) else json.dumps(message),
    }
    return {
        "metadata": {"name": "p", "labels": {"job-name": "j"}},
        "spec": {},
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [{"name": "fetch-model", "state": {"terminated": term}}],
            "containerStatuses": [
                {"name": "tuner", "state": {"waiting": {"reason": "PodInitializing"}}}
            ],
        },
    }


def record(what: str, uri: str, status: int, code: str) -> dict[str, Any]:
    return {
        "uri": uri,
        "what": what,
        "status": status,
        "code": code,
        "message": f"the Hub answered {status} ({code})",
    }


@pytest.mark.parametrize(
    ("model", "rec", "reason", "field"),
    [
        ({}, record("repo", "hf://org/m@main", 404, "RepoNotFound"), "ModelNotFound", "spec.model.uri"),
        ({"revision": "nope"}, record("revision", "hf://org/m@nope", 404, "RevisionNotFound"), "RevisionNotFound", "spec.model.revision"),
        ({"uri": "hf://org/m@nope"}, record("revision", "hf://org/m@nope", 404, "RevisionNotFound"), "RevisionNotFound", "spec.model.uri"),
        ({}, record("token", "hf://org/m@main", 401, "GatedRepo"), "ModelAccessDenied", "spec.model.tokenSecret (not set)"),
        ({"tokenSecret": {"name": "hf"}}, record("token", "hf://org/m@main", 403, "GatedRepo"), "ModelAccessDenied", "spec.model.tokenSecret (Secret 'hf', key 'token')"),
        ({"variants": {"int4": {"uri": "hf://org/awq", "method": "awq"}}}, record("repo", "hf://org/awq", 404, "RepoNotFound"), "ModelNotFound", "spec.model.variants.int4.uri"),
    ],
)  # fmt: skip
def test_a_failed_fetch_names_the_field_and_the_hubs_answer(
    model: dict[str, Any], rec: dict[str, Any], reason: str, field: str
) -> None:
    isvc = hf_isvc(**{"uri": "hf://org/m", **model})
    failed = fetch_failure([pod_summary(failed_pod(rec, EXIT_PERMANENT))])
    assert failed is not None
    got_reason, message, permanent = describe_failure(isvc, failed)
    assert (got_reason, permanent) == (reason, True)
    assert (
        message.startswith(f"{field}: ")
        and str(rec["status"]) in message
        and rec["code"] in message
    )


def test_a_transient_failure_is_not_permanent_and_a_crash_keeps_its_log_line() -> None:
    isvc = hf_isvc()
    failed = fetch_failure([pod_summary(failed_pod("Traceback...\nOSError: boom", EXIT_TRANSIENT))])
    assert failed is not None
    reason, message, permanent = describe_failure(isvc, failed)
    assert (reason, permanent) == ("ModelFetchFailed", False)
    assert message.startswith("spec.model.uri") and "OSError: boom" in message


def test_serving_pods_emptydir_is_sized_by_what_the_tuning_pod_fetched() -> None:
    isvc = hf_isvc()
    fetched_pod = failed_pod("", 0)
    term = fetched_pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    uri = "hf://meta-llama/Llama-3.1-8B-Instruct@main"
    term["message"] = json.dumps({"fetched": [{"uri": uri, "commit": COMMIT, "bytes": 16 * 2**30}]})
    summary = pod_summary(fetched_pod)
    assert fetch_failure([summary]) is None
    config = ServingConfig(engine="vllm", quantization="bf16", **KNOBS)
    config.model_bytes = fetched_bytes(summary, uri)
    assert config.model_bytes == 16 * 2**30
    spec = pod_spec(desired_deployment(isvc, config, OperatorSettings()))
    (vol,) = [v for v in spec["volumes"] if v["name"] == "model-cache"]
    room = 16 * 2**30 * 11 // 10 + 2**30  # 10% and 1 GiB more, rounded up to MiB
    assert vol["emptyDir"] == {"sizeLimit": f"{-(-room // 2**20)}Mi"}
    # The spec's (or the chart's) size wins; a claim has no size of ours.
    sized = hf_isvc(cache={"size": "100Gi"})
    spec = pod_spec(desired_deployment(sized, config, OperatorSettings()))
    assert next(v for v in spec["volumes"] if v["name"] == "model-cache")["emptyDir"] == {
        "sizeLimit": "100Gi"
    }


def serving_pod(name: str, init_status: dict[str, Any], ready: bool = False) -> dict[str, Any]:
    labels = {"app.kubernetes.io/component": "serving", "infertune.dev/track": "stable"}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": "n"},
        "status": {
            "phase": "Running" if ready else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "initContainerStatuses": [{"name": "fetch-model", **init_status}],
        },
    }


def test_a_serving_pods_failed_fetch_is_reported_once_and_cleared_when_it_serves() -> None:
    from unittest.mock import MagicMock

    from infertune.operator.api import InferenceServiceStatus
    from infertune.operator.conditions import get_condition
    from infertune.operator.context import Ctx
    from infertune.operator.model_fetch import report_serving
    from infertune.operator.runtime import Runtime

    isvc = hf_isvc(tokenSecret={"name": "hf"})
    rt = Runtime(settings=OperatorSettings(), kube=MagicMock(), metrics=MagicMock())
    st = InferenceServiceStatus()
    ctx = Ctx(rt=rt, body={}, isvc=isvc, baseline=st.model_copy(), status=st)
    refused = record("token", "hf://meta-llama/Llama-3.1-8B-Instruct@main", 403, "GatedRepo")
    # The kubelet restarted the init step: the failure is in lastState while it waits.
    crashing = {
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": EXIT_PERMANENT, "message": json.dumps(refused)}},
    }
    pods = [pod_summary(serving_pod("chat-abc", crashing))]
    assert report_serving(ctx, pods)
    shown = get_condition(ctx.status.conditions, "ModelFetched")
    assert shown is not None and (shown.status, shown.reason) == ("False", "ModelAccessDenied")
    assert (
        shown.message.startswith("spec.model.tokenSecret (Secret 'hf'") and "403" in shown.message
    )
    assert "chat-abc" in shown.message and len(ctx.events) == 1
    assert not report_serving(ctx, pods) and len(ctx.events) == 1  # once per distinct failure
    fixed = {"state": {"terminated": {"exitCode": 0, "message": "{}"}}}
    assert report_serving(ctx, [pod_summary(serving_pod("chat-def", fixed, ready=True))])
    shown = get_condition(ctx.status.conditions, "ModelFetched")
    assert shown is not None and shown.status == "True"


@pytest.mark.parametrize("revision", ["$(HOME); `reboot` ü", "../main", "a//b", "-x", "main\n"])
def test_a_hostile_revision_never_reaches_a_path_or_a_command(revision: str) -> None:
    for model in ({"uri": "hf://org/m", "revision": revision}, {"uri": f"hf://org/m@{revision}"}):
        (problem,) = spec_problems({**demo_doc()["spec"], "model": model})
        field = "spec.model.revision" if "revision" in model else "spec.model.uri"
        assert problem.startswith(field), problem


def test_a_cache_it_cannot_write_names_the_claim() -> None:
    rec = {"uri": "hf://org/m@main", "what": "cache", "message": "cannot write the model cache"}
    failed = fetch_failure([pod_summary(failed_pod(rec, EXIT_PERMANENT))])
    assert failed is not None
    reason, message, _ = describe_failure(hf_isvc(uri="hf://org/m"), failed)
    assert reason == "ModelCacheUnwritable" and message.startswith("spec.model.cache.claimName")


def test_a_gguf_model_is_fetched_whole() -> None:
    isvc = hf_isvc(uri="hf://org/m-GGUF", format="gguf")
    command = init_of(desired_job(isvc, plan_for(isvc), OperatorSettings()))["command"]
    assert command[command.index("--format") + 1] == "gguf"
    assert (
        "--format"
        not in init_of(desired_job(hf_isvc(), plan_for(hf_isvc()), OperatorSettings()))["command"]
    )


def test_the_hf_children_are_valid_kubernetes_objects() -> None:
    from kubernetes_validate import validate
    from test_builders import K8S_VERSION

    isvc = hf_isvc(revision=COMMIT, tokenSecret={"name": "hf-token"}, cache={"size": "40Gi"})
    settings = OperatorSettings(hf_endpoint="http://mirror:8080")
    config = ServingConfig(engine="llamacpp", quantization="int8", **KNOBS)
    job = desired_job(isvc, plan_for(isvc), settings)
    dep = desired_deployment(isvc, config, settings)
    for version in (K8S_VERSION, "1.28.0", "1.31.0"):  # podFailurePolicy's schema changed
        for obj in (job, dep):
            validate(obj, version, strict=True)  # podFailurePolicy, initContainers, secretKeyRef
