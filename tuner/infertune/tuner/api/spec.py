"""TuningSpec: everything the tuner needs, with no Kubernetes in it."""

from __future__ import annotations

from pydantic import Field, model_validator

from infertune.tuner.api.base import ApiModel
from infertune.tuner.api.model import ModelSource
from infertune.tuner.api.quality import QualityGuard
from infertune.tuner.api.search import Budget, SearchSpace
from infertune.tuner.api.slo import SLO
from infertune.tuner.api.traffic import TrafficProfile, default_traffic


class TuningSpec(ApiModel):
    """Model + SLOs are required; everything else has a default an SRE would pick."""

    model: ModelSource
    slo: SLO
    traffic: TrafficProfile = Field(default_factory=default_traffic)
    search: SearchSpace = Field(default_factory=SearchSpace)
    quality: QualityGuard = Field(default_factory=QualityGuard)
    budget: Budget = Field(default_factory=Budget)

    @model_validator(mode="after")
    def _parallel_fits_trials(self) -> TuningSpec:
        if self.budget.parallel_trials > self.budget.max_trials:
            raise ValueError(
                f"budget.parallelTrials ({self.budget.parallel_trials}) exceeds "
                f"budget.maxTrials ({self.budget.max_trials})"
            )
        return self
