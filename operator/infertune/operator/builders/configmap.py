"""The ConfigMap that carries one tuning run's spec into the Job's pod."""

from __future__ import annotations

import yaml

from infertune.operator.api import InferenceService
from infertune.operator.builders.common import Obj, metadata, stamp
from infertune.tuner.api import TuningSpec

SPEC_KEY = "spec.yaml"


def desired_spec_configmap(isvc: InferenceService, name: str, tuning: TuningSpec) -> Obj:
    """`tuning` is the bare TuningSpec the tuner reads (`infertune tune /etc/infertune/spec.yaml`)."""
    text = yaml.safe_dump(tuning.to_wire(), sort_keys=True)
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(isvc, name, "tuning"),
            "data": {SPEC_KEY: text},
        }
    )
