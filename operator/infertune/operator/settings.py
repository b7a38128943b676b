"""The operator's own configuration (flags and environment), parsed once into one typed model."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from infertune.operator.engine_runtime import ENGINE_RUNTIMES, EngineRuntime, parse_runtime_override

DEFAULT_IMAGE = "infertune:0.1.0"
# Images per engine; the builtin engine ships in the project's own image. Registry-less names so a
# cluster's mirror or the chart's values decide where they come from. The vLLM and SGLang tags are
# the versions the tuner-full image measures with (docker/Dockerfile.tuner pins them; a unit test
# holds the two equal), so the served flags are the ones the adapters emit and were measured with.
# How each runs in a pod (user, read-only root, caches): infertune.operator.engine_runtime.
DEFAULT_ENGINE_IMAGES: dict[str, str] = {
    "builtin": DEFAULT_IMAGE,
    "vllm": "vllm/vllm-openai:v0.33.0",
    "sglang": "lmsysorg/sglang:v0.5.23",
    "llamacpp": "llama.cpp:server",
}
SERVING_PORT = 8000
# USD per GPU-hour by GPU product (either spelling) for slo.objective cost-per-token when a
# service gives no spec.hardware.gpuHourlyPrice. ASSUMPTIONS, not quotes: round on-demand cloud
# list prices per GPU (2024); set the chart's gpuHourlyPrices to what you pay.
DEFAULT_GPU_HOURLY_PRICES: dict[str, float] = {
    "NVIDIA-H100-80GB-HBM3": 4.0,
    "NVIDIA-H100-PCIe": 3.0,
    "NVIDIA-A100-SXM4-80GB": 2.5,
    "NVIDIA-A100-SXM4-40GB": 2.0,
    "NVIDIA-L40S": 1.5,
    "NVIDIA-A10G": 1.0,
    "NVIDIA-L4": 0.8,
}


class OperatorSettings(BaseModel):
    """Everything `infertune operator` is told at start-up. Immutable while it runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    prometheus_url: str | None = None
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    health_port: int | None = Field(default=None, ge=0, le=65535)
    peering: str | None = None
    tuner_image: str = DEFAULT_IMAGE
    engine_images: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_ENGINE_IMAGES))
    engine_runtimes: dict[str, EngineRuntime] = Field(
        default_factory=lambda: dict(ENGINE_RUNTIMES),
        description="Per engine image: user, read-only root, writable paths (engine_runtime.py).",
    )
    image_pull_secrets: tuple[str, ...] = Field(
        default=(), description="Secret names on every pod the operator creates (the chart's)."
    )
    # argv prefix that runs the `infertune` CLI inside the images (a local test cluster runs
    # containers as host processes, where the console script lives in a virtualenv).
    infertune_command: tuple[str, ...] = ("infertune",)
    storage_secret: str | None = Field(
        default=None, description="Secret NAME[:KEY] holding the study storage URL (key `url`)."
    )
    tuning_service_account: str | None = None
    monitor_tick_s: float = Field(default=5.0, gt=0, le=600)
    job_backoff_limit: int = Field(default=2, ge=0, le=20)
    scrape_timeout_s: float = Field(default=3.0, gt=0, le=60)
    serving_port: int = SERVING_PORT
    min_requests_for_drift: int = Field(default=20, ge=1)
    min_gain: float = Field(
        default=0.05, ge=0, le=10, description="Relative objective gain a retune must show."
    )
    image_pull_policy: str = "IfNotPresent"
    gpu_hourly_prices: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_GPU_HOURLY_PRICES),
        description="USD per GPU-hour by GPU product, for the cost-per-token objective.",
    )
    model_cache_claim: str | None = Field(
        default=None, description="PVC (in each service's namespace) for hf:// models."
    )
    model_cache_size: str | None = Field(
        default=None, description="sizeLimit of the per-pod emptyDir cache without a claim."
    )
    hf_endpoint: str | None = Field(
        default=None, description="HF_ENDPOINT of the fetch-model init step (a Hub mirror)."
    )

    @field_validator("storage_secret")
    @classmethod
    def _secret_ref(cls, value: str | None) -> str | None:
        if value is not None and (not value or value.startswith(":") or value.count(":") > 1):
            raise ValueError(f"--storage-secret {value!r}: write NAME or NAME:KEY")
        return value

    @property
    def storage_secret_ref(self) -> tuple[str, str] | None:
        if not self.storage_secret:
            return None
        name, _, key = self.storage_secret.partition(":")
        return name, key or "url"

    def runtime_for(self, engine: str) -> EngineRuntime:
        return self.engine_runtimes.get(engine, ENGINE_RUNTIMES["builtin"])

    def image_for(self, engine: str) -> str:
        if engine not in self.engine_images:
            raise ValueError(
                f"no image configured for engine {engine!r}; configured engines: "
                f"{sorted(self.engine_images)} (set --engine-image {engine}=IMAGE)"
            )
        return self.engine_images[engine]


def _engine_image(text: str) -> tuple[str, str]:
    engine, sep, image = text.partition("=")
    if not sep or not engine or not image:
        raise argparse.ArgumentTypeError(f"--engine-image {text!r}: write ENGINE=IMAGE")
    return engine, image


def _engine_runtime(text: str) -> tuple[str, dict[str, object]]:
    try:
        return parse_runtime_override(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _gpu_price(text: str) -> tuple[str, float]:
    product, sep, price = text.rpartition("=")
    try:
        value = float(price)
    except ValueError:
        value = -1.0
    if not sep or not product or not value >= 0:
        raise argparse.ArgumentTypeError(f"--gpu-hourly-price {text!r}: write PRODUCT=USD")
    return product, value


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="infertune operator",
        description="Run the InferenceService operator (kopf).",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], dest="namespaces")
    scope.add_argument("-A", "--all-namespaces", action="store_true")
    p.add_argument("--prometheus-url", default=env("INFERTUNE_PROMETHEUS_URL"))
    p.add_argument("--metrics-port", type=int, default=int(env("INFERTUNE_METRICS_PORT", "8080")))
    p.add_argument("--health-port", type=int, default=None, help="kopf liveness endpoint port")
    p.add_argument("--peering", default=env("INFERTUNE_PEERING"), help="kopf peering name (HA)")
    p.add_argument("--tuner-image", default=env("INFERTUNE_TUNER_IMAGE", DEFAULT_IMAGE))
    p.add_argument("--engine-image", action="append", type=_engine_image, default=[])
    p.add_argument(
        "--engine-runtime",
        action="append",
        type=_engine_runtime,
        default=[],
        help="ENGINE=JSON: fields of an engine's runtime row (runAsUser, readOnlyRootFilesystem, ...)",
    )
    p.add_argument(
        "--image-pull-secret",
        action="append",
        default=[s for s in env("INFERTUNE_IMAGE_PULL_SECRETS", "").split(",") if s],
        help="Secret name for pulling images, on every pod the operator creates (repeatable)",
    )
    p.add_argument(
        "--infertune-command",
        default=env("INFERTUNE_COMMAND", "infertune"),
        help="how the images run the CLI (space-separated argv prefix)",
    )
    p.add_argument("--storage-secret", default=env("INFERTUNE_STORAGE_SECRET"))
    p.add_argument("--tuning-service-account", default=env("INFERTUNE_TUNING_SERVICE_ACCOUNT"))
    p.add_argument("--monitor-tick", type=float, default=5.0, help="seconds between SLO checks")
    p.add_argument(
        "--drift-min-requests",
        type=int,
        default=20,
        help="requests a check window needs before its traffic counts toward drift",
    )
    p.add_argument(
        "--gpu-hourly-price",
        action="append",
        type=_gpu_price,
        default=[],
        metavar="PRODUCT=USD",
        help="USD per GPU-hour of a GPU product (cost-per-token); adds to or replaces a default",
    )
    p.add_argument(
        "--model-cache-claim",
        default=env("INFERTUNE_MODEL_CACHE_CLAIM"),
        help="PVC name (in each service's namespace) that hf:// models are fetched into once",
    )
    p.add_argument(
        "--model-cache-size",
        default=env("INFERTUNE_MODEL_CACHE_SIZE"),
        help="sizeLimit of the per-pod emptyDir model cache when no claim is named",
    )
    p.add_argument(
        "--hf-endpoint",
        default=env("INFERTUNE_HF_ENDPOINT"),
        help="Hugging Face Hub endpoint (a mirror) for the fetch-model init step",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def settings_from_args(args: argparse.Namespace) -> OperatorSettings:
    images = dict(DEFAULT_ENGINE_IMAGES)
    images["builtin"] = args.tuner_image
    images.update(dict(args.engine_image))
    runtimes = dict(ENGINE_RUNTIMES)
    for engine, fields in args.engine_runtime:
        runtimes[engine] = runtimes.get(engine, ENGINE_RUNTIMES["builtin"]).merged(fields)
    return OperatorSettings(
        namespaces=tuple(args.namespaces),
        all_namespaces=bool(args.all_namespaces),
        prometheus_url=args.prometheus_url or None,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        peering=args.peering or None,
        tuner_image=args.tuner_image,
        engine_images=images,
        engine_runtimes=runtimes,
        image_pull_secrets=tuple(dict.fromkeys(args.image_pull_secret)),
        infertune_command=tuple(args.infertune_command.split()),
        storage_secret=args.storage_secret or None,
        tuning_service_account=args.tuning_service_account or None,
        monitor_tick_s=args.monitor_tick,
        min_requests_for_drift=args.drift_min_requests,
        gpu_hourly_prices={**DEFAULT_GPU_HOURLY_PRICES, **dict(args.gpu_hourly_price)},
        model_cache_claim=args.model_cache_claim or None,
        model_cache_size=args.model_cache_size or None,
        hf_endpoint=args.hf_endpoint or None,
    )


def parse_settings(argv: Sequence[str]) -> tuple[OperatorSettings, argparse.Namespace]:
    args = build_parser().parse_args(list(argv))
    return settings_from_args(args), args
