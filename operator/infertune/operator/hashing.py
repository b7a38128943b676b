"""Stable hashes: what the tuning depends on, and what a serving pod template depends on."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from infertune.operator.api import InferenceServiceSpec, ServingConfig
from infertune.tuner.api import TuningSpec


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def digest(obj: Any) -> str:
    return hashlib.sha256(canonical(obj).encode()).hexdigest()


def tuning_hash(spec: InferenceServiceSpec) -> str:
    """Hash of everything a tuning result depends on: the TuningSpec and the hardware it runs on.

    rollout (replicas, canary) and retune (intervals, thresholds) are left out on purpose: changing
    them must never start a new study.
    """
    return digest({"tuning": spec.tuning_spec().to_wire(), "hardware": spec.hardware.to_wire()})


def run_hash(tuning: TuningSpec, gpu_product: str | None) -> str:
    """Hash of what one tuning run is actually given (a retune may use observed traffic)."""
    return digest({"tuning": tuning.to_wire(), "gpuProduct": gpu_product})


def config_hash(config: ServingConfig, model_uri: str, image: str) -> str:
    """Identity of a serving pod template's behaviour: knobs + model + image (measured figures excluded)."""
    knobs = config.candidate().to_dict()
    return digest({"knobs": knobs, "model": model_uri, "image": image})[:16]
