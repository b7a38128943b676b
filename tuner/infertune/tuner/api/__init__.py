"""The tuner's API: TuningSpec and its parts (pydantic v2, torch-free, Kubernetes-free)."""

from infertune.tuner.api.base import (
    ENGINE_QUANTIZATIONS,
    ENGINES,
    PERCENTILES,
    QUANTIZATIONS,
    ApiModel,
)
from infertune.tuner.api.durations import Duration, parse_duration
from infertune.tuner.api.model import ModelSource
from infertune.tuner.api.quality import QualityGuard
from infertune.tuner.api.search import Budget, IntChoice, SearchSpace
from infertune.tuner.api.slo import SLO, SLO_METRICS, LatencyObjective
from infertune.tuner.api.spec import TuningSpec
from infertune.tuner.api.traffic import LengthDistribution, TrafficProfile

__all__ = [
    "ENGINES",
    "ENGINE_QUANTIZATIONS",
    "PERCENTILES",
    "QUANTIZATIONS",
    "SLO",
    "SLO_METRICS",
    "ApiModel",
    "Budget",
    "Duration",
    "IntChoice",
    "LatencyObjective",
    "LengthDistribution",
    "ModelSource",
    "QualityGuard",
    "SearchSpace",
    "TrafficProfile",
    "TuningSpec",
    "parse_duration",
]
