"""A winner served from model.variants: the Deployment loads the variant with its method, the
tuning Job mounts every variant's claim, and the method travels in the tuner's summary."""

from __future__ import annotations

import json
from typing import Any

from operator_samples import demo_doc, isvc_from
from test_builders import plan_for

from infertune.operator.api import ServingConfig
from infertune.operator.builders.deployment import desired_deployment, serving_argv
from infertune.operator.builders.job import desired_job
from infertune.operator.settings import OperatorSettings
from infertune.operator.summary import parse_summary
from infertune.tuner.api.base import to_camel

KNOBS: dict[str, Any] = {
    "max_num_seqs": 16,
    "max_num_batched_tokens": 4096,
    "kv_block_size": 16,
    "cuda_graph": True,
}
VARIANTS = {
    "int4": {"uri": "pvc://quantized/llama-awq"},
    "int8": {"uri": "hf://org/llama-W8A8", "method": "compressed-tensors"},
}


def variant_isvc() -> Any:
    return isvc_from(
        demo_doc(
            model__uri="pvc://models/llama",
            model__variants=VARIANTS,
            search__engines=["vllm"],
            search__quantizations=["bf16", "int4"],
        )
    )


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_deployment_serves_the_variant_with_the_measured_method() -> None:
    isvc, settings = variant_isvc(), OperatorSettings()
    config = ServingConfig(engine="vllm", quantization="int4", quantization_method="awq", **KNOBS)
    argv = serving_argv(isvc, config, settings)
    assert flag(argv, "--model") == "/mnt/models/quantized/llama-awq"
    assert flag(argv, "--quantization") == "awq"
    pod = desired_deployment(isvc, config, settings)["spec"]["template"]["spec"]
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["quantized"]
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert "/mnt/models/quantized" in mounts


def test_the_spec_method_and_uri_when_the_summary_has_none() -> None:
    isvc, settings = variant_isvc(), OperatorSettings()
    argv = serving_argv(
        isvc, ServingConfig(engine="sglang", quantization="int8", **KNOBS), settings
    )
    # An hf:// variant is served from the model cache, where the pod's fetch step puts it.
    assert flag(argv, "--model-path") == "/mnt/model-cache/hf/org/llama-W8A8/main"
    assert flag(argv, "--quantization") == "compressed-tensors"


def test_other_precisions_and_engines_serve_model_uri() -> None:
    isvc, settings = variant_isvc(), OperatorSettings()
    bf16 = serving_argv(isvc, ServingConfig(engine="vllm", quantization="bf16", **KNOBS), settings)
    assert flag(bf16, "--model") == "/mnt/models/models/llama"
    assert "--quantization" not in bf16


def test_the_tuning_job_mounts_every_variant_claim() -> None:
    isvc = variant_isvc()
    job = desired_job(isvc, plan_for(isvc), OperatorSettings())
    pod = job["spec"]["template"]["spec"]
    claims = sorted(
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    )
    assert claims == ["models", "quantized"]
    paths = [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]]
    assert "/mnt/models/models" in paths and "/mnt/models/quantized" in paths
    assert len(paths) == len(set(paths))


def test_the_summary_carries_the_method() -> None:
    knobs = {to_camel(k): v for k, v in KNOBS.items()}
    best = {"engine": "vllm", "quantization": "int4", **knobs, "quantizationMethod": "awq"}
    summary = parse_summary(json.dumps({"version": 1, "status": "succeeded", "best": best}))
    assert not isinstance(summary, str)
    config = summary.serving_config()
    assert config is not None and config.quantization_method == "awq"
