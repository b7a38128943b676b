from __future__ import annotations

import pytest
from operator_samples import demo_doc, isvc_from

from infertune.operator.api import InferenceService, ServingConfig
from infertune.operator.settings import OperatorSettings


@pytest.fixture
def isvc() -> InferenceService:
    return isvc_from(demo_doc())


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings()


@pytest.fixture
def config() -> ServingConfig:
    return ServingConfig(
        engine="builtin",
        quantization="int8",
        max_num_seqs=16,
        max_num_batched_tokens=512,
        kv_block_size=16,
        cuda_graph=False,
    )
