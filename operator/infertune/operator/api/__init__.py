"""The InferenceService API (group infertune.dev, version v1alpha1) as pydantic models."""

from infertune.operator.api.resource import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    InferenceService,
)
from infertune.operator.api.spec import (
    Canary,
    DriftThresholds,
    Hardware,
    InferenceServiceSpec,
    RetunePolicy,
    Rollout,
    Toleration,
)
from infertune.operator.api.status import (
    CONDITION_TYPES,
    Condition,
    Figures,
    HistoryEntry,
    InferenceServiceStatus,
    Observation,
    Profile,
    ServingConfig,
    TuningRun,
)

__all__ = [
    "API_VERSION",
    "CONDITION_TYPES",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "Canary",
    "Condition",
    "DriftThresholds",
    "Figures",
    "Hardware",
    "HistoryEntry",
    "InferenceService",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "Observation",
    "Profile",
    "RetunePolicy",
    "Rollout",
    "ServingConfig",
    "Toleration",
    "TuningRun",
]
