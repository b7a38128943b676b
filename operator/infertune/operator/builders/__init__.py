"""Pure desired-state builders: (InferenceService, inputs) -> the child object as an API dict."""

from infertune.operator.builders.common import (
    LABEL_COMPONENT,
    LABEL_ISVC,
    LABEL_MANAGED,
    owner_reference,
)
from infertune.operator.builders.configmap import desired_spec_configmap
from infertune.operator.builders.deployment import desired_deployment, serving_argv
from infertune.operator.builders.job import RunPlan, desired_job
from infertune.operator.builders.service import desired_service

__all__ = [
    "LABEL_COMPONENT",
    "LABEL_ISVC",
    "LABEL_MANAGED",
    "RunPlan",
    "desired_deployment",
    "desired_job",
    "desired_service",
    "desired_spec_configmap",
    "owner_reference",
    "serving_argv",
]
