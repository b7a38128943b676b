"""GPU hygiene of the tuning pod: a trial's peak GPU memory read per device from NVML above the
baseline before the engine started (process IDs never match inside a container), and profiling
runs in a child process that exits before any engine starts (the quality guard asks the engines
themselves, through their API: the tuner holds no model for it)."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from infertune.tuner import process
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import get_adapter
from infertune.tuner.hardware import Hardware
from infertune.tuner.process import EngineProcess, peak_above

GIB = 1 << 30


def test_peak_above_the_baseline_is_per_device() -> None:
    baseline = [1 * GIB, 2 * GIB]
    peak = peak_above([], [5 * GIB, 2 * GIB], baseline)
    assert peak == [4 * GIB, 0]
    # A later lower reading keeps each device's peak; another device's rise adds to it.
    peak = peak_above(peak, [3 * GIB, 6 * GIB], baseline)
    assert peak == [4 * GIB, 4 * GIB]
    # Another process freeing memory below the baseline never counts negative.
    assert peak_above([], [0, 0], baseline) == [0, 0]


def test_a_trials_gpu_peak_is_read_from_devices_not_process_ids(
    gpu: Hardware, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings = iter([[10 * GIB, 1 * GIB], [30 * GIB, 9 * GIB], [20 * GIB, 1 * GIB]])
    monkeypatch.setattr(process, "gpu_used_per_device", lambda: next(readings))
    engine = EngineProcess(
        get_adapter("builtin"), Candidate("builtin", "bf16", 4, 256, 16, False), tmp_path,
        tmp_path / "work", gpu,
    )  # fmt: skip
    engine.gpu_baseline = process.gpu_used_per_device()  # what start() reads before Popen
    engine.proc = types.SimpleNamespace(pid=os.getpid())  # type: ignore[assignment]
    assert engine.sample_memory() == 28 * GIB  # 20 GiB on device 0, 8 on device 1
    assert engine.sample_memory() == 28 * GIB and engine.gpu_peak == [20 * GIB, 8 * GIB]


def test_without_nvml_the_resident_set_is_the_fallback(
    cpu: Hardware, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "gpu_used_per_device", lambda: None)
    engine = EngineProcess(
        get_adapter("builtin"), Candidate("builtin", "fp32", 4, 256, 16, False), tmp_path,
        tmp_path / "work", cpu,
    )  # fmt: skip
    engine.proc = types.SimpleNamespace(pid=os.getpid())  # type: ignore[assignment]
    assert engine.gpu_baseline is None and engine.sample_memory() > 0


def _pid() -> int:
    return os.getpid()


def _fail() -> None:
    raise ValueError("no such precision")


def test_in_child_runs_elsewhere_returns_the_result_and_leaves_no_process() -> None:
    import multiprocessing

    assert process.in_child(_pid) != os.getpid()
    with pytest.raises(ValueError, match="no such precision"):
        process.in_child(_fail)
    assert multiprocessing.active_children() == []


def test_isolation_is_on_for_gpus_and_forced_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(process.ISOLATE_ENV, raising=False)
    assert process.isolate_gpu_work(True) and not process.isolate_gpu_work(False)
    monkeypatch.setenv(process.ISOLATE_ENV, "1")
    assert process.isolate_gpu_work(False)
    monkeypatch.setenv(process.ISOLATE_ENV, "0")
    assert not process.isolate_gpu_work(True)


def test_profiling_gives_the_same_answer_from_a_child() -> None:
    """What tune.py runs in a child on a GPU (ceilings + the built-in engine's profile) pickles
    both ways and answers as it does inline (both read the same per-machine caches here)."""
    import functools

    from infertune.engine.make_model import ensure_model
    from infertune.tuner.hardware import discover
    from infertune.tuner.profiler import measure_all

    model = ensure_model("tiny")
    measure = functools.partial(
        measure_all, discover(use_gpu=False), {"fp32"}, model, ["fp32", "bf16"],
        prompt_tokens=32, batch=4, reference="fp32",
    )  # fmt: skip
    ceilings, profile = process.in_child(measure)
    assert ceilings.memory_bandwidth_gbps > 0 and set(profile.precisions) == {"fp32", "bf16"}
