"""The GPU check behind scripts/gpu_check.sh (issue 19, point 6); see that script for how to run it.

Three steps, each ending in a compact table:

1. The built-in engine (ModelRunner, greedy) in every precision, CUDA graphs off and on: does each
   precision's greedy output equal the reference's (fp32 on the CPU, bf16 on a GPU, with fp32 as a
   second reference there), is graph output identical to eager output (it must be), decode tok/s,
   and the graphs' speed-up.
2. The profiler's ceilings (memory bandwidth, matmul FLOP/s) freshly measured, against the GPU's
   datasheet (hardware.GPU_SPECS).
3. A builtin study of 6 trials (2 in a dry run) through run_tuning, profiling and the quality
   guard in a child process as on any GPU.

`--dry-run`: the CPU, the tiny model, few steps; CUDA-only steps are skipped with the reason
printed. Exit 1 when a check that must hold fails (graphs differ from eager, the study measures
nothing), else 0.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")


def table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    cells = [header, *[[_cell(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n== {title}")
    for i, r in enumerate(cells):
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def greedy(runner: Any, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], float]:
    """Greedy tokens of every prompt (one batch) and the decode steps' seconds."""
    from infertune.engine.runner import StepInput

    block = runner.block_size
    per_seq = math.ceil((max(map(len, prompts)) + steps + 1) / block)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(prompts))]
    out = runner.execute([StepInput(i, list(p), 0, tables[i], True) for i, p in enumerate(prompts)])
    tokens = [[int(t)] for t in out if t is not None]
    started = time.perf_counter()
    for step in range(1, steps):
        batch = [
            StepInput(i, [tokens[i][-1]], len(p) + step - 1, tables[i], True)
            for i, p in enumerate(prompts)
        ]
        for i, t in enumerate(runner.execute(batch)):  # ints: the device has synchronised
            tokens[i].append(int(t if t is not None else -1))
    return tokens, time.perf_counter() - started


def engine_check(model: Path, device: str, batch: int, prompt_len: int, steps: int) -> bool:
    from infertune.engine.runner import ModelRunner

    cuda = device.startswith("cuda")
    prompts = [[1 + (31 * i + 7 * j) % 3000 for j in range(prompt_len)] for i in range(batch)]
    per_seq = math.ceil((prompt_len + steps + 1) / 16)
    results: dict[tuple[str, bool], tuple[list[list[int]], float]] = {}
    skipped: list[list[Any]] = []
    for q in PRECISIONS:
        for graph in (False, True):
            if graph and not cuda:
                skipped.append([q, "graphs", "CUDA graphs need a CUDA device (dry run: skipped)"])
                continue
            try:
                runner = ModelRunner(
                    model, quantization=q, kv_block_size=16, num_kv_blocks=batch * per_seq,
                    device=device, cuda_graph=graph, max_num_seqs=batch,
                )  # fmt: skip
                greedy(runner, prompts, min(steps, 4))  # warm-up: kernels, graph capture
                results[(q, graph)] = greedy(runner, prompts, steps)
            except (ValueError, RuntimeError) as exc:  # UnsupportedConfig is a ValueError
                skipped.append([q, "graphs" if graph else "eager", str(exc).splitlines()[0][:90]])
            finally:
                runner = None
                if cuda:
                    import torch

                    torch.cuda.empty_cache()
    refs = [r for r in ("bf16", "fp32") if (r, False) in results] if cuda else ["fp32"]
    ok = True
    rows = []
    for (q, graph), (tokens, seconds) in results.items():
        tok_s = batch * (steps - 1) / seconds if seconds > 0 else None
        eager = results.get((q, False))
        same_as_eager = None if not graph or eager is None else tokens == eager[0]
        ok = ok and same_as_eager is not False
        speedup = eager[1] / seconds if graph and eager and seconds > 0 else None
        agree = []
        for ref in refs:
            ref_tokens = results[(ref, False)][0] if (ref, False) in results else None
            if ref_tokens is None:
                continue
            same = sum(
                t == r
                for a, b in zip(tokens, ref_tokens, strict=True)
                for t, r in zip(a, b, strict=True)
            )
            agree.append(f"{ref} {same / (batch * steps):.0%}")
        rows.append([q, "on" if graph else "off", tok_s, speedup, same_as_eager, ", ".join(agree)])
    table(
        f"built-in engine on {device}: batch {batch}, prompt {prompt_len}, {steps} greedy tokens",
        ["precision", "graphs", "tok/s", "graph x", "graph==eager", "tokens = reference"],
        rows,
    )
    if skipped:
        table("skipped", ["precision", "mode", "why"], skipped)
    return ok


def ceilings_check(hardware: Any, dry: bool) -> None:
    from infertune.tuner.ceilings import measure
    from infertune.tuner.hardware import gpu_spec

    dtypes = ["fp32"] if dry else ["fp32", "bf16", "fp16"]
    c = measure(hardware, dtypes, quick=dry)
    spec = gpu_spec(hardware.product) if hardware.is_gpu else None
    sheet = {
        "memory GB/s": spec.memory_bandwidth_gbps if spec else None,
        "fp32 TFLOP/s": spec.fp32_tflops if spec else None,
        "bf16 TFLOP/s": spec.bf16_tflops if spec else None,
        "fp16 TFLOP/s": spec.bf16_tflops if spec else None,
    }
    got = {"memory GB/s": c.memory_bandwidth_gbps}
    got.update({f"{d} TFLOP/s": f / 1e12 for d, f in c.peak_flops.items()})
    rows = [
        [k, v, sheet.get(k), None if not sheet.get(k) else f"{v / sheet[k]:.0%}"]
        for k, v in got.items()
    ]
    rows.append(["launch overhead us", c.launch_overhead_us, None, None])
    why = "" if spec else " (no datasheet: not a GPU of hardware.GPU_SPECS)"
    table(
        f"ceilings on {hardware.describe()}{why}",
        ["ceiling", "measured", "datasheet", "share"],
        rows,
    )


def study_check(model_size: str, out: Path, dry: bool) -> bool:
    from infertune.tuner.api.load import load_tuning_spec
    from infertune.tuner.candidate import Candidate
    from infertune.tuner.tune import TuneOptions, run_tuning

    doc = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["uri"] = f"builtin://{model_size}"
    spec["slo"] = {"ttft": {"max": "2s"}, "itl": {"max": "100ms"}, "objective": "goodput"}
    spec["traffic"].update(
        rate=4 if dry else 40,
        promptTokens={"distribution": "uniform", "min": 32, "max": 96}
        if dry
        else {"distribution": "uniform", "min": 128, "max": 512},
        outputTokens={"distribution": "fixed", "mean": 8 if dry else 64},
        numRequests=8 if dry else 120,
        warmupRequests=2 if dry else 8,
    )
    spec["search"].update(
        quantizations=["fp32"] if dry else ["bf16", "fp16", "fp8", "int8", "int4"],
        maxNumSeqs={"values": [4, 8]} if dry else {"values": [16, 32, 64]},
        maxNumBatchedTokens={"values": [128, 256]} if dry else {"values": [512, 1024, 2048]},
        kvBlockSizes=[16],
        cudaGraph=[False] if dry else [False, True],
    )
    spec["quality"] = {"reference": "fp32" if dry else "bf16", "minTop1Agreement": 0.5}
    spec["budget"] = {"maxTrials": 2 if dry else 6, "maxDuration": "3m", "trialTimeout": "90s"}
    path = out / "gpu-check.yaml"
    path.write_text(yaml.safe_dump(doc))
    tuning = load_tuning_spec(path)
    opts = TuneOptions(
        study_name="gpu-check", out=out, storage=f"sqlite:///{out / 'study.db'}",
        use_gpu=not dry, log=lambda msg: print(f"  {msg}", flush=True),
    )  # fmt: skip
    started = time.monotonic()
    result = run_tuning(tuning, opts)
    rows = []
    for t in result.trials:
        f = t.figures or {}
        try:
            label = Candidate.from_dict(t.config).label()
        except (TypeError, ValueError, KeyError):  # a trial that failed before its config was whole
            label = str(t.config)[:70]
        mem = t.peak_memory_bytes / 2**30 if t.peak_memory_bytes else None
        rows.append([
            t.number, label, t.outcome, f.get("goodputRps"), f.get("outputTokensPerSecond"),
            f.get("ttftP95Ms"), f.get("itlP95Ms"), mem, t.startup_s,
        ])  # fmt: skip
    table(
        f"builtin study: {len(result.trials)} trials in {time.monotonic() - started:.0f}s, "
        f"{result.status}: {result.reason}",
        [
            "#",
            "config",
            "outcome",
            "goodput/s",
            "tok/s",
            "ttft p95",
            "itl p95",
            "peak GiB",
            "start s",
        ],
        rows,
    )
    return any(t.figures for t in result.trials)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny sizes, CUDA steps skipped"
    )
    parser.add_argument("--out", type=Path, default=None, help="study folder (default: a temp dir)")
    parser.add_argument("--size", default=None, help="model size (default: medium, tiny dry)")
    args = parser.parse_args(argv)
    import torch

    from infertune.engine.make_model import ensure_model
    from infertune.tuner.hardware import discover

    dry = args.dry_run
    if dry:
        os.environ.setdefault("INFERTUNE_ISOLATE_GPU_WORK", "1")  # the child path, as on a GPU
    cuda = torch.cuda.is_available() and not dry
    if not cuda and not dry:
        print("no CUDA device: run with --dry-run on a CPU", file=sys.stderr)
        return 2
    hardware = discover(use_gpu=not dry)
    size = args.size or ("tiny" if dry else "medium")
    print(f"torch {torch.__version__}, {hardware.describe()}, model {size}, dry run: {dry}")
    model = ensure_model(size)
    ok = engine_check(
        model, hardware.device if cuda else "cpu",
        batch=2 if dry else 32, prompt_len=16 if dry else 256, steps=6 if dry else 64,
    )  # fmt: skip
    ceilings_check(hardware, dry)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        measured = study_check(size, out, dry)
    if not measured:
        print("FAIL: the study measured no trial")
    if not ok:
        print("FAIL: CUDA graph output differs from eager output")
    print("gpu check: " + ("ok" if ok and measured else "FAILED"))
    return 0 if ok and measured else 1


if __name__ == "__main__":
    sys.exit(main())
