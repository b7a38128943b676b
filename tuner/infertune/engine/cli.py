"""``infertune serve`` and ``infertune make-model``: argument parsing and process lifecycle.

torch is imported only inside :func:`serve_main` so that ``--help`` and argument errors stay fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from infertune.engine.core_process import spawn_core

__all__ = ["build_serve_parser", "default_threads", "make_model_main", "parse_size", "serve_main"]

QUANTIZATIONS = ("fp32", "bf16", "fp16", "int8", "int4", "fp8")
MODEL_SIZES = ("tiny", "small", "medium")
DEFAULT_KV_CACHE = "256MiB"
DEFAULT_GPU_UTILIZATION = 0.9
_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30,
}  # fmt: skip

log = logging.getLogger("infertune.engine")


def parse_size(text: str) -> int:
    """``512MiB``, ``1.5GiB``, ``800M`` or a plain byte count, as bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size; use bytes or a number with KiB/MiB/GiB (or KB/MB/GB), "
            "e.g. 512MiB"
        )
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive size")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in (0, 1]")
    return value


def build_serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="infertune serve",
        description="Serve a Llama-family checkpoint over an OpenAI-compatible HTTP API.",
    )
    p.add_argument(
        "--model",
        required=True,
        help=f"checkpoint directory, or one of {', '.join(MODEL_SIZES)} for a generated model",
    )
    p.add_argument("--served-model-name", help="name in /v1/models (default: the directory name)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="fp32")
    p.add_argument("--int4-group-size", type=int, choices=(32, 64, 128), default=64)
    p.add_argument("--max-num-seqs", type=_positive_int, default=32)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=512)
    p.add_argument("--kv-block-size", type=_positive_int, default=16)
    mem = p.add_mutually_exclusive_group()
    mem.add_argument(
        "--kv-cache-memory",
        type=parse_size,
        help=f"bytes for the paged KV cache, e.g. 512MiB (default on CPU: {DEFAULT_KV_CACHE})",
    )
    mem.add_argument(
        "--gpu-memory-utilization",
        type=_fraction,
        help="CUDA only: fraction of GPU memory for weights + KV cache, the rest left free "
        f"(default on CUDA: {DEFAULT_GPU_UTILIZATION}, as vLLM)",
    )
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--max-model-len", type=_positive_int, help="context length (default: model's)")
    p.add_argument(
        "--max-waiting",
        type=_positive_int,
        default=512,
        help="waiting-queue bound; beyond it requests get 503 + Retry-After",
    )
    p.add_argument(
        "--threads",
        type=_positive_int,
        help="torch threads for decode steps (default: the usable cores minus one, at least one)",
    )
    p.add_argument(
        "--prefill-threads",
        type=_positive_int,
        help=(
            "torch threads for steps of at least 128 tokens, i.e. prefill (default: every "
            "usable core; such steps are large GEMMs, which scale with cores)"
        ),
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--log-level", default="WARNING")
    return p


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """torch threads when ``--threads`` is not given: the cores this process may use, minus one.

    The spare core runs the event loop (HTTP, detokenisation) and usually the clients. With
    every core in OpenMP, the engine's spinning threads and the server fight over the same
    cores: measured on 2 cores under load, 2 threads ran the decode loop ~20x slower than 1.
    A decode step is some 200 small ops, each a barrier for every thread; a prefill step is
    the same ops on hundreds of rows, so it gets every core (``--prefill-threads``).
    """
    return max(1, usable_cores() - 1)


def _model_dir(model: str) -> Path:
    # The operator passes the spec's URI as is: builtin://SIZE and file:///dir are accepted too.
    model = model.removeprefix("builtin://").removeprefix("file://")
    path = Path(model)
    if path.is_dir():
        return path
    if model in MODEL_SIZES:
        from infertune.engine.make_model import ensure_model

        return ensure_model(model)
    raise SystemExit(
        f"--model {model!r} is neither a checkpoint directory nor one of {', '.join(MODEL_SIZES)} "
        "(optionally as builtin://SIZE)"
    )


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def _gpu_utilization_on_cpu(device: str) -> str:
    return (
        "--gpu-memory-utilization applies to CUDA devices only; on "
        f"device={device!r} size the cache with --kv-cache-memory (e.g. 512MiB)"
    )


def _kv_cache_bytes(args: argparse.Namespace, model_dir: Path, device: str) -> int:
    """Bytes for the KV cache from --kv-cache-memory or --gpu-memory-utilization."""
    if args.kv_cache_memory is not None:
        return int(args.kv_cache_memory)
    utilization = args.gpu_memory_utilization
    if utilization is None:
        if not device.startswith("cuda"):
            return parse_size(DEFAULT_KV_CACHE)
        utilization = DEFAULT_GPU_UTILIZATION
    if not device.startswith("cuda"):
        raise SystemExit(_gpu_utilization_on_cpu(device))
    import torch

    from infertune.engine.config import LlamaConfig, kv_bytes_per_token, weight_bytes

    cfg = LlamaConfig.from_dir(model_dir)
    free, total = torch.cuda.mem_get_info(torch.device(device))
    weights = weight_bytes(cfg, args.quantization)
    # Activations and allocator slack for one max_num_batched_tokens step (generous).
    reserve = 256 * 2**20 + 64 * args.max_num_batched_tokens * 2**10
    budget = int(utilization * total) - (total - free) - weights - reserve
    if budget <= 0:
        raise SystemExit(
            f"--gpu-memory-utilization {utilization} leaves no room for a KV "
            f"cache ({(total - free) / 2**30:.1f} GiB in use, weights {weights / 2**30:.2f} GiB)"
        )
    # More blocks than every running sequence at full context can use is wasted memory (and a
    # long free list); fp32 bytes per token make this an upper bound for every precision.
    max_len = min(args.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
    useful = args.max_num_seqs * max_len * kv_bytes_per_token(cfg, "fp32")
    return int(min(budget, useful))


def build_runner(args: argparse.Namespace, model_dir: Path) -> Any:
    """The :class:`ModelRunner` for ``args``; runs in the runner process (it imports torch)."""
    import torch

    from infertune.engine.runner import ModelRunner

    started = time.perf_counter()
    decode_threads = args.threads or default_threads()
    torch.set_num_threads(decode_threads)
    device = _device(args.device)
    if args.quantization == "fp32" and device == "cpu":
        from infertune.engine.kernels import describe

        log.info("fp32 linear layers: %s", describe())
    runner = ModelRunner(
        model_dir,
        quantization=args.quantization,
        kv_block_size=args.kv_block_size,
        kv_cache_bytes=_kv_cache_bytes(args, model_dir, device),
        device=device,
        cuda_graph=args.cuda_graph,
        max_num_seqs=args.max_num_seqs,
        seed=args.seed,
        int4_group_size=args.int4_group_size,
        threads=(decode_threads, args.prefill_threads or usable_cores()),
    )
    log.info(
        "engine core: model and %d-block KV cache built in %.2f s",
        runner.num_kv_blocks,
        time.perf_counter() - started,
    )
    return runner


def serve_main(argv: list[str]) -> int:
    started = time.perf_counter()
    args = build_serve_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.max_num_batched_tokens < args.max_num_seqs:
        log.warning(
            "--max-num-batched-tokens %d < --max-num-seqs %d: at most %d sequences can decode "
            "per step, so the newest running ones wait",
            args.max_num_batched_tokens,
            args.max_num_seqs,
            args.max_num_batched_tokens,
        )
    explicit_cpu = args.device != "auto" and not args.device.startswith("cuda")
    if args.gpu_memory_utilization is not None and explicit_cpu:  # known before any process
        raise SystemExit(_gpu_utilization_on_cpu(args.device))
    # The engine-core process first: it imports torch (most of start-up), then loads the weights
    # and warms up, while this one imports its own modules and starts the server.
    core = spawn_core()
    try:
        model_dir = _model_dir(args.model)
        from infertune.engine.config import LlamaConfig
        from infertune.engine.engine_core import RemoteEngine, RunnerStartError

        cfg = LlamaConfig.from_dir(model_dir)
        max_model_len = min(
            args.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings
        )
        engine = RemoteEngine(
            "infertune.engine.cli:build_runner",
            {"args": args, "model_dir": model_dir},
            {
                "max_num_seqs": args.max_num_seqs,
                "max_num_batched_tokens": args.max_num_batched_tokens,
                "max_model_len": max_model_len,
                "eos_token_ids": cfg.eos_token_ids,
                "max_waiting": args.max_waiting,
            },
            log_level=args.log_level,
            core=core,
        )
    except BaseException:  # a bad --model or config: the core has nothing to run
        core.kill()
        raise
    try:
        return _serve_with(engine, args, model_dir, started)
    except RunnerStartError as exc:  # a knob this setup cannot run, named by the message
        print(f"infertune serve: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.close()


def _serve_with(engine: Any, args: argparse.Namespace, model_dir: Path, started: float) -> int:
    import asyncio  # here, not at the top: the engine core is spawned before the heavier imports

    from tokenizers import Tokenizer

    from infertune.engine.server import EngineServer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    name = args.served_model_name or model_dir.name
    server = EngineServer(engine, tokenizer, model_name=name, model_dir=model_dir)
    info = engine.wait_ready()  # built and warmed up in the core process
    log.info(
        "%s: %s, %d KV blocks of %d tokens, weights %.1f MiB; ready in %.2f s",
        name,
        args.quantization,
        info.num_kv_blocks,
        args.kv_block_size,
        info.weight_bytes / 2**20,
        time.perf_counter() - started,
    )
    try:
        asyncio.run(_serve(server, args.host, args.port))
    except OSError as exc:  # e.g. the port is taken
        print(f"infertune serve: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.stop()
    return 0


async def _serve(server: Any, host: str, port: int) -> None:
    import asyncio

    from infertune.engine.server import start_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server.engine.start()
    runner, bound = await start_server(server, host, port)
    print(f"infertune engine ready on http://{host}:{bound}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def make_model_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="infertune make-model",
        description="Write a random-weight Llama checkpoint with a trained BPE tokenizer.",
    )
    p.add_argument("dir", type=Path, help="output directory")
    p.add_argument("--size", choices=MODEL_SIZES, default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--force", action="store_true", help="rewrite even when DIR already holds this recipe"
    )
    args = p.parse_args(argv)
    from infertune.engine.make_model import ensure_model, write_model

    path = (
        write_model(args.dir, args.size, seed=args.seed)
        if args.force
        else ensure_model(args.size, args.dir, seed=args.seed)
    )
    print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m infertune.engine.cli serve ...`
    commands = {"serve": serve_main, "make-model": make_model_main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print("usage: python -m infertune.engine.cli {serve,make-model} ...", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(commands[sys.argv[1]](sys.argv[2:]))
