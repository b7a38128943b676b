"""A tuning run as a real cluster sees it: the first run starts the cooldown clock, the Job loads
one replica with its share of the service's rate, and a cost-per-token run is told the GPU price."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from unittest.mock import MagicMock

from operator_samples import demo_doc, isvc_from

from infertune.operator.api import InferenceServiceStatus
from infertune.operator.builders.job import gpu_price_args
from infertune.operator.checking import epoch
from infertune.operator.context import Ctx
from infertune.operator.drift import in_cooldown
from infertune.operator.runtime import Runtime
from infertune.operator.settings import OperatorSettings, parse_settings
from infertune.operator.summary import parse_summary
from infertune.operator.tuning_run import start_run


class _Kube:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def create(self, obj: dict[str, Any]) -> None:
        self.created.append(obj)

    async def delete(self, *_: Any) -> None:
        return None


def _ctx(**spec: Any) -> tuple[Ctx, _Kube]:
    isvc = isvc_from(demo_doc(**spec))
    kube = _Kube()
    rt = Runtime(settings=OperatorSettings(), kube=kube, metrics=MagicMock())  # type: ignore[arg-type]
    st = InferenceServiceStatus()
    return Ctx(rt=rt, body={}, isvc=isvc, baseline=st.model_copy(), status=st), kube


def test_the_first_run_starts_the_cooldown_and_loads_one_replicas_share() -> None:
    ctx, kube = _ctx(traffic__rate=12, rollout__replicas=3, retune__cooldown="30m")
    asyncio.run(start_run(ctx, "Created", ctx.isvc.spec.tuning_spec()))
    st = ctx.status
    assert st.last_retune_time == ctx.now
    # A HardwareChanged or drift retune right after the first run is held back by the cooldown.
    assert in_cooldown(epoch(st.last_retune_time), time.time(), 1800.0)
    assert st.tuning is not None and (st.tuning.replicas, st.tuning.replica_rate) == (3, 4.0)
    (configmap,) = [o for o in kube.created if o["kind"] == "ConfigMap"]
    assert "rate: 4.0" in next(iter(configmap["data"].values()))


def test_cost_runs_get_the_gpu_price_and_the_status_carries_the_cost() -> None:
    isvc = isvc_from(demo_doc(slo__objective="cost-per-token"))
    settings, _ = parse_settings(["--gpu-hourly-price", "NVIDIA-L4=0.5"])
    args = gpu_price_args(isvc, settings)
    assert "NVIDIA-L4=0.5" in args and "NVIDIA-H100-80GB-HBM3=4" in args
    own = isvc_from(demo_doc(slo__objective="cost-per-token", hardware__gpuHourlyPrice=2.25))
    assert gpu_price_args(own, settings) == ["--gpu-hourly-price", "2.25"]
    assert gpu_price_args(isvc_from(demo_doc()), settings) == []  # goodput: no price needed
    best = {"engine": "builtin", "quantization": "int8", "maxNumSeqs": 8, "maxNumBatchedTokens": 256,
            "kvBlockSize": 16, "cudaGraph": False, "measured": {"outputTokensPerSecond": 1000.0},
            "costPerMillionTokens": 1.111}  # fmt: skip
    summary = parse_summary(
        '{"version":1,"status":"succeeded","gpuProduct":"NVIDIA-L4","best":'
        + __import__("json").dumps(best)
        + "}"
    )
    assert not isinstance(summary, str)
    config = summary.serving_config()
    assert config is not None and config.cost_per_million_tokens == 1.111
