"""The built-in engine's own profile: prefill and decode per precision, against the roofline.

Runs only when `builtin` is in the search space (tune.py); the floors come from the analytic
ModelShape, which needs no engine. Runs the built-in engine's ModelRunner directly (no server):
one prompt-length prefill and decode steps at batch 1 and at a larger batch, best of a few
repeats after a warm-up; then one prefill and one decode step under `torch.profiler`, with
operator time grouped into GEMM, attention, elementwise/norm and other, and the host-side gap
(time no operator accounts for).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from infertune.engine.config import LlamaConfig
from infertune.engine.runner import ModelRunner, StepInput
from infertune.tuner.hardware import Hardware
from infertune.tuner.model_shape import ModelShape
from infertune.tuner.modelprofile import ModelProfile, PhaseResult, PrecisionProfile, phase_result
from infertune.tuner.roofline import (
    Ceilings,
    PhaseFloor,
    decode_floor,
    fit_step_model,
    kv_dtype,
    prefill_floor,
)

PROFILE_VERSION = 2  # 2: floors and byte counts from the analytic ModelShape
_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("attention", "softmax", "bmm", "baddbmm", "index_select", "gather")),
    ("gemm", ("mm", "addmm", "matmul", "linear", "_int_mm", "weight_int", "int4", "dot")),
    (
        "elementwise",
        (
            "add",
            "mul",
            "rsqrt",
            "pow",
            "mean",
            "silu",
            "sigmoid",
            "neg",
            "cat",
            "div",
            "exp",
            "norm",
            "copy",
            "to",
            "sub",
        ),
    ),
)


def group_of(name: str) -> str:
    low = name.lower().removeprefix("aten::")
    for group, keys in _GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _best_ms(fn: Callable[[], object], device: str, repeats: int, min_total: float = 0.3) -> float:
    """Best of at least `repeats` calls, continuing until `min_total` seconds passed (shared CPUs)."""
    fn()
    _sync(device)
    best = math.inf
    began = time.perf_counter()
    done = 0
    while done < repeats or (time.perf_counter() - began < min_total and done < 20 * repeats):
        done += 1
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Drop the trace markers kineto writes to fd 2 on every start/stop ("USDT:... profiler_start",
    "STAGE:..."; no environment variable turns them off in torch 2.13), keep everything else."""
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith(("USDT:", "STAGE:")):
                    sys.stderr.write(line)


def _trace(fn: Callable[[], object], device: str) -> tuple[dict[str, float], float, int, float]:
    """(ms per operator group, host gap ms, top-level operator count, wall ms) of one call."""
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with _quiet_kineto(), profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        _sync(device)
        wall = (time.perf_counter() - start) * 1e3
    groups = {"gemm": 0.0, "attention": 0.0, "elementwise": 0.0, "other": 0.0}
    busy = 0.0
    count = 0
    for ev in prof.key_averages():
        if not ev.key.startswith("aten::"):
            continue
        gpu = getattr(ev, "self_device_time_total", 0.0) or 0.0
        us = gpu if device.startswith("cuda") else ev.self_cpu_time_total
        groups[group_of(ev.key)] += us / 1e3
        busy += us / 1e3
        count += ev.count
    return groups, max(0.0, wall - busy), count, wall


def _prefill_batch(cfg: LlamaConfig, tokens: int, block: int) -> list[StepInput]:
    ids = [(7 * i + 3) % cfg.vocab_size for i in range(tokens)]
    return [StepInput(0, ids, 0, list(range(math.ceil((tokens + 1) / block))), True)]


def _decode_batch(cfg: LlamaConfig, batch: int, context: int, block: int) -> list[StepInput]:
    per_seq = math.ceil((context + 1) / block)
    return [
        StepInput(
            i,
            [(5 * i + 1) % cfg.vocab_size],
            context,
            list(range(i * per_seq, (i + 1) * per_seq)),
            True,
        )
        for i in range(batch)
    ]


def _phase(
    name: str,
    tokens: int,
    measured: float,
    floor: PhaseFloor,
    ceilings: Ceilings,
    trace: tuple[dict[str, float], float, int, float] | None,
) -> PhaseResult:
    if trace is None:
        return phase_result(name, tokens, measured, floor, None)
    kernel_ms, host_gap_ms, operators, _ = trace
    return phase_result(
        name,
        tokens,
        measured,
        floor,
        operators * ceilings.launch_overhead_us / 1e3,
        kernel_ms=kernel_ms,
        host_gap_ms=host_gap_ms,
        operators=operators,
    )


def profile_precision(
    model_dir: Path,
    quantization: str,
    ceilings: Ceilings,
    *,
    prompt_tokens: int,
    batch: int,
    repeats: int = 3,
    trace: bool = True,
) -> PrecisionProfile:
    device = ceilings.device
    block = 16
    context = prompt_tokens
    per_seq = math.ceil((context + 2) / block)
    runner = ModelRunner(
        model_dir,
        quantization=quantization,
        kv_block_size=block,
        num_kv_blocks=max(batch, 1) * per_seq + 1,
        device=device,
        max_num_seqs=batch,
    )
    cfg = runner.config
    prefill = _prefill_batch(cfg, prompt_tokens, block)
    dec1 = _decode_batch(cfg, 1, context, block)
    decn = _decode_batch(cfg, batch, context, block)
    t_prefill = _best_ms(lambda: runner.execute(prefill), device, repeats)
    t_dec1 = _best_ms(lambda: runner.execute(dec1), device, repeats)
    t_decn = _best_ms(lambda: runner.execute(decn), device, repeats)
    tr_prefill = _trace(lambda: runner.execute(prefill), device) if trace else None
    tr_decode = _trace(lambda: runner.execute(dec1), device) if trace else None
    shape = ModelShape.from_dir(model_dir)
    f_prefill = prefill_floor(shape, ceilings, quantization, prompt_tokens)
    f_dec1 = decode_floor(shape, ceilings, quantization, 1, context)
    f_decn = decode_floor(shape, ceilings, quantization, batch, context)
    points = [(1, t_dec1), (batch, t_decn), (prompt_tokens, t_prefill)]
    return PrecisionProfile(
        quantization=quantization,
        weight_bytes=shape.read_bytes(quantization),
        kv_bytes_per_token=shape.kv_bytes_per_token(kv_dtype(quantization, device)),
        flops_per_token=shape.flops_per_token(context),
        prefill=_phase("prefill", prompt_tokens, t_prefill, f_prefill, ceilings, tr_prefill),
        decode=_phase("decode", 1, t_dec1, f_dec1, ceilings, tr_decode),
        decode_batched=_phase("decode", batch, t_decn, f_decn, ceilings, None),
        step_model=fit_step_model(points),
    )


def _cache_path(model_dir: Path, ceilings: Ceilings, key: str) -> Path:
    root = os.environ.get("INFERTUNE_CACHE") or str(Path.home() / ".cache/infertune")
    cfg = hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()[:12]
    weights = sorted(model_dir.glob("*.safetensors"))
    stamp = "-".join(str(int(w.stat().st_mtime)) for w in weights)
    digest = hashlib.sha256(f"{cfg}:{stamp}:{key}:{PROFILE_VERSION}".encode()).hexdigest()[:16]
    return Path(root) / "profiles" / ceilings.fingerprint / f"{digest}.json"


def _cached_precision(
    model_dir: Path, q: str, ceilings: Ceilings, prompt_tokens: int, batch: int, repeats: int
) -> PrecisionProfile:
    """A precision's profile, measured once per (machine, checkpoint, shape) and cached."""
    path = _cache_path(model_dir, ceilings, f"{q}:{prompt_tokens}:{batch}")
    if path.exists():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            raw = json.loads(path.read_text())
            wrapper = ModelProfile.from_dict(
                {
                    "hardware": "",
                    "ceilings": ceilings.to_dict(),
                    "reference": q,
                    "precisions": {q: raw},
                }
            )
            return wrapper.precisions[q]
    prof = profile_precision(
        model_dir, q, ceilings, prompt_tokens=prompt_tokens, batch=batch, repeats=repeats
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(prof)))
    return prof


def profile_model(
    model_dir: Path,
    quantizations: Iterable[str],
    ceilings: Ceilings,
    *,
    prompt_tokens: int,
    batch: int,
    reference: str,
    repeats: int = 3,
) -> ModelProfile:
    """Profile every precision the built-in engine can load here; failures become notes."""
    out = ModelProfile(hardware=ceilings.hardware, ceilings=ceilings, reference=reference)
    wanted = list(dict.fromkeys([reference, *quantizations]))
    for q in wanted:
        try:
            out.precisions[q] = _cached_precision(
                model_dir, q, ceilings, prompt_tokens, batch, repeats
            )
        except (ValueError, RuntimeError) as exc:  # UnsupportedConfig is a ValueError
            out.notes.append(f"{q}: not profiled ({exc})")
    if reference not in out.precisions and out.precisions:
        out.reference = next(iter(out.precisions))
    return out


def measure_all(
    hardware: Hardware,
    dtypes: Iterable[str],
    model_dir: Path | None,
    quantizations: list[str],
    *,
    prompt_tokens: int,
    batch: int,
    reference: str,
) -> tuple[Ceilings, ModelProfile]:
    """The ceilings and, with `model_dir`, the built-in engine's profile: every GPU allocation of
    the tuner's own, in one call that tune.py runs in a child process (process.in_child)."""
    from infertune.tuner.ceilings import load_or_measure

    ceilings = load_or_measure(hardware, dtypes)
    if model_dir is None:
        return ceilings, ModelProfile(ceilings.hardware, ceilings, reference)
    profile = profile_model(
        model_dir,
        quantizations,
        ceilings,
        prompt_tokens=prompt_tokens,
        batch=batch,
        reference=reference,
    )
    return ceilings, profile
