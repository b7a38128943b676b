"""The serving pod of a vLLM or SGLang winner: started by the interpreter that has the engine in
its image (no `python3` that means SGLang's venv in tuner-full), with a memory-backed /dev/shm sized
from the pod's memory, the same in the tuning pod that starts trials, and the tensor-parallel size
of the replica's GPUs."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from kubernetes_validate import validate
from operator_samples import ROOT, demo_doc, isvc_from
from test_builders import K8S_VERSION, plan_for, pod_spec

from infertune.operator.api import ServingConfig
from infertune.operator.builders import desired_deployment, desired_job
from infertune.operator.engine_runtime import memory_bytes, shm_size_limit
from infertune.operator.settings import OperatorSettings, parse_settings

VALUES = yaml.safe_load((ROOT / "charts" / "infertune" / "values.yaml").read_text())
DOCKERFILE = (ROOT / "docker" / "Dockerfile.tuner").read_text()


def _config(engine: str, **extra: Any) -> ServingConfig:
    fields = dict(
        engine=engine,
        quantization="bf16",
        max_num_seqs=16,
        max_num_batched_tokens=512,
        kv_block_size=16,
        cuda_graph=False,
    )
    return ServingConfig(**{**fields, **extra})


def _chart_settings() -> OperatorSettings:
    """The operator as the chart starts it: tuner-full for vLLM and SGLang, their runtime rows."""
    import json

    args: list[str] = []
    for engine in ("vllm", "sglang"):
        runtime = VALUES["engines"][engine]["runtime"]
        args += ["--engine-image", f"{engine}=infertune/tuner-full:0.1.0"]
        args += ["--engine-runtime", f"{engine}={json.dumps(runtime)}"]
    settings, _ = parse_settings(args)
    return settings


def _engine_python_env(engine: str) -> str:
    found = re.search(rf"INFERTUNE_{engine.upper()}_PYTHON=(\S+)", DOCKERFILE)
    assert found, f"docker/Dockerfile.tuner sets no INFERTUNE_{engine.upper()}_PYTHON"
    return found.group(1)


@pytest.mark.parametrize(
    ("engine", "module"),
    [("vllm", "vllm.entrypoints.openai.api_server"), ("sglang", "sglang.launch_server")],
)
def test_tuner_full_serving_runs_the_interpreter_the_trials_ran(engine: str, module: str) -> None:
    """In tuner-full `python3` has neither engine (it once found SGLang's venv first on PATH and
    the vLLM pod died: "No module named vllm"). The Deployment names the engine's own venv, the
    same interpreter the tuner's trials ran (INFERTUNE_<ENGINE>_PYTHON in the image)."""
    dep = desired_deployment(isvc_from(demo_doc()), _config(engine), _chart_settings())
    command = pod_spec(dep)["containers"][0]["command"]
    assert command[:3] == [_engine_python_env(engine), "-m", module]
    assert command[0] == f"/opt/engines/{engine}/bin/python"


def test_tuner_full_puts_no_engine_venv_on_path() -> None:
    paths = re.findall(r"PATH=(\S+)", DOCKERFILE)
    assert paths and not any("/opt/engines/" in p for p in paths)


def test_upstream_images_keep_their_python3() -> None:
    dep = desired_deployment(isvc_from(demo_doc()), _config("vllm"), OperatorSettings())
    assert pod_spec(dep)["containers"][0]["command"][0] == "python3"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_serving_pod_mounts_a_memory_backed_dev_shm_sized_from_the_pods_memory(engine: str) -> None:
    isvc = isvc_from(demo_doc(hardware__memory="64Gi"))
    for settings in (OperatorSettings(), _chart_settings()):
        dep = desired_deployment(isvc, _config(engine), settings)
        validate(dep, K8S_VERSION, strict=True)
        pod = pod_spec(dep)
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32768Mi"}
        mounts = pod["containers"][0]["volumeMounts"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in mounts


def test_tuning_pod_mounts_dev_shm_for_the_engines_it_starts() -> None:
    isvc = isvc_from(demo_doc(hardware__memory="16Gi"))
    job = desired_job(isvc, plan_for(isvc), OperatorSettings())
    validate(job, K8S_VERSION, strict=True)
    pod = pod_spec(job)
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8192Mi"}} in pod[
        "volumes"
    ]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]


def test_memory_quantities_and_shm_limits() -> None:
    assert memory_bytes("8Gi") == 8 * 2**30 and memory_bytes("1.5Gi") == int(1.5 * 2**30)
    assert memory_bytes("512M") == 512 * 10**6 and memory_bytes("1048576") == 2**20
    assert shm_size_limit("8Gi") == "4096Mi"
    assert shm_size_limit("64Mi") == "64Mi"  # never below the container runtime's default


def _tp_flag_landed() -> bool:
    return (
        "tensor_parallel" in ServingConfig.model_fields
        or "tensor_parallel_size" in ServingConfig.model_fields
    )


@pytest.mark.xfail(
    not _tp_flag_landed(),
    reason="the tensor-parallel knob (issue 19 point 2) has not landed in ServingConfig/adapters",
    strict=True,
)
@pytest.mark.parametrize(
    ("engine", "flag"), [("vllm", "--tensor-parallel-size"), ("sglang", "--tp-size")]
)
def test_deployment_carries_the_tensor_parallel_size_of_the_replicas_gpus(
    engine: str, flag: str
) -> None:
    isvc = isvc_from(demo_doc(hardware__gpusPerReplica=2))
    field = (
        "tensor_parallel_size"
        if "tensor_parallel_size" in ServingConfig.model_fields
        else "tensor_parallel"
    )
    config = _config(engine, **{field: 2}) if _tp_flag_landed() else _config(engine)
    command = pod_spec(desired_deployment(isvc, config, _chart_settings()))["containers"][0][
        "command"
    ]
    aliases = {flag, "--tensor-parallel-size", "--tp-size", "--tp"}
    given = [command[i + 1] for i, a in enumerate(command[:-1]) if a in aliases]
    assert given == [str(isvc.spec.hardware.gpus_per_replica)]
