"""InferenceService spec: the tuner's TuningSpec plus where and how to run it on a cluster."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from infertune.tuner.api import ApiModel, Duration, ModelSource, TuningSpec
from infertune.tuner.gpu_identity import product_label

RetuneTrigger = Literal["SLOViolation", "TrafficDrift", "HardwareChanged"]
# Label keys and values as Kubernetes defines them (qualified name / label value).
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


class Toleration(ApiModel):
    key: str | None = Field(default=None, max_length=316)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)


class Hardware(ApiModel):
    node_selector: dict[str, str] = Field(default_factory=dict)
    gpu_products: list[str] = Field(
        default_factory=list,
        description="Accepted values of the node label nvidia.com/gpu.product (any when empty); "
        "NVML's spelling (nvidia-smi's 'NVIDIA H100 80GB HBM3') is taken as the label's.",
    )
    gpus_per_replica: int = Field(default=1, ge=0, le=64)
    gpu_hourly_price: float | None = Field(
        default=None,
        ge=0,
        le=10_000,
        description="USD per GPU-hour of this service's GPUs, for slo.objective cost-per-token "
        "(cost = gpusPerReplica x price / (output tokens/s x 3600)); unset: the operator's price "
        "for the GPU product (chart value gpuHourlyPrices).",
    )
    tolerations: list[Toleration] = Field(default_factory=list)
    cpu: str = Field(
        default="2", pattern=r"^[0-9]+(\.[0-9]+)?m?$", description="CPU request per pod."
    )
    memory: str = Field(
        default="8Gi",
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$",
        description="Memory per pod.",
    )

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, selector: dict[str, str]) -> dict[str, str]:
        import re

        for key, value in selector.items():
            if len(key) > 316 or not re.match(_LABEL_KEY, key):
                raise ValueError(f"node selector key {key!r} is not a valid label key")
            if len(value) > 63 or not re.match(_LABEL_VALUE, value):
                raise ValueError(
                    f"node selector value {value!r} for {key!r} is not a valid label value"
                )
        return selector

    @field_validator("gpu_products")
    @classmethod
    def _products(cls, products: list[str]) -> list[str]:
        import re

        products = [product_label(p) if p.strip() else p for p in products]
        bad = [p for p in products if len(p) > 63 or not re.match(_LABEL_VALUE, p)]
        if bad:
            raise ValueError(
                f"GPU products must be label values (nvidia.com/gpu.product), got {bad}"
            )
        return products


class Canary(ApiModel):
    enabled: bool = False
    replicas: int = Field(default=1, ge=1, le=100)
    window: Duration = Field(default=Duration("5m"), description="How long the canary must hold.")


RolloutStrategy = Literal["Auto", "Surge", "ReplaceInPlace"]


class Rollout(ApiModel):
    replicas: int = Field(default=1, ge=0, le=1000)
    strategy: RolloutStrategy = Field(
        default="Auto",
        description=(
            "How a new config replaces the serving pods. Surge: one extra pod first (maxSurge 1, "
            "maxUnavailable 0), which needs a free GPU. ReplaceInPlace: one pod at a time is "
            "stopped and replaced (maxSurge 0, maxUnavailable 1), so no spare GPU is needed; a "
            "canary takes one of the stable replicas' slots (refused when replicas <= "
            "canary.replicas). Auto: surge, and switch to ReplaceInPlace as soon as the scheduler "
            "cannot place a surge or canary pod."
        ),
    )
    canary: Canary = Field(default_factory=Canary)
    rollback_on_slo_breach: bool = True


class DriftThresholds(ApiModel):
    """Relative change from the tuned traffic that counts as drift (0.5 = 50%)."""

    rate: float = Field(default=0.5, gt=0, le=100)
    prompt_tokens: float = Field(default=0.5, gt=0, le=100)
    output_tokens: float = Field(default=0.5, gt=0, le=100)


class RetunePolicy(ApiModel):
    enabled: bool = True
    triggers: list[RetuneTrigger] = Field(
        default_factory=lambda: list[RetuneTrigger](
            ["SLOViolation", "TrafficDrift", "HardwareChanged"]
        )
    )
    check_interval: Duration = Field(default=Duration("60s"))
    violation_window: Duration = Field(
        default=Duration("5m"), description="SLOs must be missed this long before a retune."
    )
    cooldown: Duration = Field(default=Duration("30m"), description="Minimum time between retunes.")
    drift: DriftThresholds = Field(default_factory=DriftThresholds)

    @model_validator(mode="after")
    def _window_spans_checks(self) -> RetunePolicy:
        if float(self.violation_window) < float(self.check_interval):
            raise ValueError(
                f"violationWindow ({self.violation_window}) must be at least checkInterval "
                f"({self.check_interval}), or one bad sample would trigger a retune"
            )
        return self


class LocalObjectReference(ApiModel):
    """A Secret in the InferenceService's namespace, by name (its contents are never read)."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


_QUANTITY = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|K|M|G|T|P)?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class SecretKeySelector(ApiModel):
    """A key of a Secret in the InferenceService's namespace (read by the kubelet, never by the
    operator, and never logged)."""

    name: str = Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)
    key: str = Field(default="token", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class ModelCache(ApiModel):
    """Where hf:// models are fetched to: a claim shared by the service's pods, else an emptyDir
    per pod."""

    claim_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="A PersistentVolumeClaim in this namespace, mounted at /mnt/model-cache: each "
        "repository and revision is fetched into it once and every pod (tuning and serving) reads "
        "it from there. Pods on several nodes need ReadWriteMany (or ReadOnlyMany once filled). "
        "Default: the operator's (chart value modelCache.claimName), else an emptyDir per pod.",
    )
    size: str | None = Field(
        default=None,
        pattern=_QUANTITY,
        description="sizeLimit of the per-pod emptyDir used when no claim is named (room for the "
        "checkpoint's files). Default: the chart's modelCache.size, else no limit.",
    )


class ClusterModelSource(ModelSource):
    """model, plus what only a cluster needs to fetch an hf:// model: its token's Secret and the
    cache volume. Not part of the tuning spec (a new token or cache never retunes)."""

    token_secret: SecretKeySelector | None = Field(
        default=None,
        description="The Secret key holding a Hugging Face token, for gated or private hf:// "
        "models: given to the fetch-model init step as $HF_TOKEN (secretKeyRef), nowhere else.",
    )
    cache: ModelCache | None = None

    def hf_uris(self) -> list[str]:
        uris = [self.uri] + [v.uri for _, v in (self.variants.items() if self.variants else [])]
        return [u for u in uris if u.startswith("hf://")]

    @model_validator(mode="after")
    def _only_for_hf(self) -> ClusterModelSource:
        if not self.hf_uris():
            for name, value in (("tokenSecret", self.token_secret), ("cache", self.cache)):
                if value is not None:
                    raise ValueError(
                        f"model.{name} applies to hf:// models only; model.uri {self.uri!r} "
                        "and its variants are not fetched (remove it)"
                    )
        return self

    def tuning_source(self) -> ModelSource:
        """The tuner's part: the model without its token and cache."""
        return ModelSource.model_validate(
            self.model_dump(exclude={"token_secret", "cache"}, exclude_none=True)
        )


class InferenceServiceSpec(TuningSpec):
    model: ClusterModelSource
    hardware: Hardware = Field(default_factory=Hardware)
    rollout: Rollout = Field(default_factory=Rollout)
    retune: RetunePolicy = Field(default_factory=RetunePolicy)
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=32,
        description="Pull secrets (in this namespace) added to the operator's own (the chart's "
        "global.imagePullSecrets) on every pod made for this service: serving, canary, tuning.",
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="ServiceAccount of the serving pods (its token is not mounted); tuning pods "
        "keep the operator's tuning account.",
    )

    def tuning_spec(self) -> TuningSpec:
        """The part handed to the tuner; a change elsewhere (replicas, retune policy) never retunes."""
        fields = {name: getattr(self, name) for name in TuningSpec.model_fields}
        return TuningSpec.model_validate({**fields, "model": self.model.tuning_source()})
