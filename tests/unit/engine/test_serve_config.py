"""``infertune serve`` flags -> ServeConfig, the value the server hands the engine-core process."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from infertune.engine.cli import parse_serve_args
from infertune.engine.config import LlamaConfig
from infertune.engine.serve_config import ServeConfig


def test_flag_defaults_are_the_config_defaults_and_it_pickles() -> None:
    assert parse_serve_args(["--model", "tiny"]) == ServeConfig(model="tiny")
    config = parse_serve_args(
        ["--model", "/m", "--quantization", "int4", "--kv-cache-memory", "64MiB",
         "--max-num-seqs", "4", "--no-cuda-graph", "--threads", "3", "--max-model-len", "99"]
    )  # fmt: skip
    assert (config.quantization, config.kv_cache_memory, config.max_num_seqs) == (
        "int4",
        64 * 2**20,
        4,
    )
    assert (config.threads, config.max_model_len, config.cuda_graph) == (3, 99, False)
    assert pickle.loads(pickle.dumps(config)) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]


def test_engine_settings_cap_the_context_at_the_model() -> None:
    model = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, vocab_size=100, max_position_embeddings=2048,
        eos_token_ids=(2,),
    )  # fmt: skip
    assert ServeConfig(model="m").engine_kwargs(model) == {
        "max_num_seqs": 32,
        "max_num_batched_tokens": 512,
        "max_model_len": 2048,
        "eos_token_ids": (2,),
        "max_waiting": 512,
    }
    assert ServeConfig(model="m", max_model_len=100).context_length(model) == 100
    assert ServeConfig(model="m", max_model_len=10**6).context_length(model) == 2048
