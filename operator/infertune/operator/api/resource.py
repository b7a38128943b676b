"""The whole InferenceService object as the API server stores it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from infertune.operator.api.spec import InferenceServiceSpec
from infertune.operator.api.status import InferenceServiceStatus

GROUP = "infertune.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
# "isvc" is KServe's short name; a distinct one keeps both operators usable on one cluster.
SHORT_NAMES = ["itsvc"]


class InferenceService(BaseModel):
    """apiVersion/kind/metadata/spec/status; metadata is Kubernetes' own, kept as a plain mapping."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["infertune.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["InferenceService"]
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: InferenceServiceSpec
    status: InferenceServiceStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))
