"""``--quantization auto``: the faster of fp32 and bf16 on this host, measured and cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_reference import tiny_model

from infertune.engine import precision
from infertune.engine.build import build_runner
from infertune.engine.cli import parse_serve_args
from infertune.engine.serve_config import ServeConfig


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFERTUNE_CACHE", str(tmp_path))
    # The kernels' own build cache moves with INFERTUNE_CACHE; keep using the built library.
    monkeypatch.setenv("INFERTUNE_KERNEL_DIR", str(Path.home() / ".cache/infertune/kernels"))
    return tmp_path / "precision"


def test_serve_defaults_to_auto() -> None:
    assert parse_serve_args(["--model", "tiny"]).quantization == "auto"


def test_the_choice_is_the_faster_measured_and_cached(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    timings = precision.measure("cpu")
    assert set(timings) == {"fp32", "bf16"} and all(t > 0 for t in timings.values())
    monkeypatch.setattr(precision, "measure", lambda device: {"fp32": 2.0, "bf16": 3.0})
    assert precision.fastest("cpu") == "fp32"
    (record_path,) = cache.glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["fastest"] == "fp32"
    assert record["ms_per_pass"] == {"fp32": 2000.0, "bf16": 3000.0}

    def not_again(device: str) -> dict[str, float]:
        raise AssertionError("measured twice on one host")

    monkeypatch.setattr(precision, "measure", not_again)
    assert precision.fastest("cpu") == "fp32"  # from the cache


def test_a_new_thread_count_or_kernel_build_measures_again() -> None:
    torch.set_num_threads(1)
    one = precision.fingerprint("cpu")
    torch.set_num_threads(2)
    try:
        assert precision.fingerprint("cpu") != one
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("measured", ["fp32", "bf16"])
def test_serve_builds_the_model_in_the_measured_precision(
    measured: str, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = "bf16" if measured == "fp32" else "fp32"
    monkeypatch.setattr(precision, "measure", lambda device: {measured: 1.0, other: 2.0})
    config = ServeConfig(model=str(tiny_model()), kv_cache_memory=2**20, threads=1)
    runner = build_runner(config, tiny_model())
    assert runner.quantization == measured
    assert runner.model.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[measured]
