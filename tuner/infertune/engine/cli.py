"""``infertune serve`` and ``infertune make-model``: flags in, process lifecycle.

``serve`` parses its flags into a :class:`~infertune.engine.serve_config.ServeConfig`, spawns the
engine-core process first (:mod:`infertune.engine.core_spawn`), then resolves the model and hands
both to a :class:`~infertune.engine.core_client.RemoteEngine` and the HTTP server. The runner is
built in the core (:mod:`infertune.engine.build`), which never imports this module; this process
never imports torch for ``serve`` unless it generates a built-in model.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from infertune.engine.core_spawn import spawn_core
from infertune.engine.pretrained import PRETRAINED, PretrainedMissingError, ensure_builtin
from infertune.engine.serve_config import (
    DEFAULT_GPU_UTILIZATION,
    DEFAULT_KV_CACHE_BYTES,
    MODEL_SIZES,
    QUANTIZATIONS,
    ServeConfig,
    gpu_utilization_on_cpu,
)

__all__ = ["build_serve_parser", "make_model_main", "parse_serve_args", "parse_size", "serve_main"]

DEFAULT_KV_CACHE = f"{DEFAULT_KV_CACHE_BYTES // 2**20}MiB"
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
    """The ``serve`` flags; every destination is a :class:`ServeConfig` field, and the defaults
    are its defaults."""
    d = ServeConfig(model="")
    p = argparse.ArgumentParser(
        prog="infertune serve",
        description="Serve a Llama-family checkpoint over an OpenAI-compatible HTTP API.",
    )
    p.add_argument(
        "--model",
        required=True,
        help=(
            f"checkpoint directory, one of {', '.join(MODEL_SIZES)} for a generated random-weight "
            f"model, or {', '.join(PRETRAINED)} (a real one); also as builtin://NAME"
        ),
    )
    p.add_argument("--served-model-name", help="name in /v1/models (default: the directory name)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default=d.quantization)
    p.add_argument("--int4-group-size", type=int, choices=(32, 64, 128), default=d.int4_group_size)
    p.add_argument("--max-num-seqs", type=_positive_int, default=d.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=d.max_num_batched_tokens)
    p.add_argument("--kv-block-size", type=_positive_int, default=d.kv_block_size)
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
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=d.cuda_graph)
    p.add_argument("--device", default=d.device, help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--max-model-len", type=_positive_int, help="context length (default: model's)")
    p.add_argument(
        "--max-waiting",
        type=_positive_int,
        default=d.max_waiting,
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
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--log-level", default=d.log_level)
    return p


def parse_serve_args(argv: list[str]) -> ServeConfig:
    """The :class:`ServeConfig` for ``infertune serve ARGV`` (argparse exits on a bad flag)."""
    return ServeConfig(**vars(build_serve_parser().parse_args(argv)))


def _model_dir(model: str) -> Path:
    # The operator passes the spec's URI as is: builtin://NAME and file:///dir are accepted too.
    model = model.removeprefix("builtin://").removeprefix("file://")
    path = Path(model)
    if path.is_dir():
        return path
    if model in MODEL_SIZES or model in PRETRAINED:
        try:
            return ensure_builtin(model)
        except PretrainedMissingError as exc:
            raise SystemExit(f"--model {model!r}: {exc}") from None
    raise SystemExit(
        f"--model {model!r} is neither a checkpoint directory nor one of "
        f"{', '.join((*MODEL_SIZES, *PRETRAINED))} (optionally as builtin://NAME)"
    )


def serve_main(argv: list[str]) -> int:
    started = time.perf_counter()
    config = parse_serve_args(argv)
    logging.basicConfig(
        level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    if config.max_num_batched_tokens < config.max_num_seqs:
        log.warning(
            "--max-num-batched-tokens %d < --max-num-seqs %d: at most %d sequences can decode "
            "per step, so the newest running ones wait",
            config.max_num_batched_tokens,
            config.max_num_seqs,
            config.max_num_batched_tokens,
        )
    explicit_cpu = config.device != "auto" and not config.device.startswith("cuda")
    if config.gpu_memory_utilization is not None and explicit_cpu:  # known before any process
        raise SystemExit(gpu_utilization_on_cpu(config.device))
    # The engine-core process first: it imports torch (most of start-up), then loads the weights
    # and warms up, while this one imports its own modules and starts the server.
    core = spawn_core()
    try:
        model_dir = _model_dir(config.model)
        from infertune.engine.core_client import RemoteEngine, RunnerStartError

        engine = RemoteEngine(config, model_dir, core=core)
    except BaseException:  # a bad --model or config: the core has nothing to run
        core.kill()
        raise
    try:
        return _serve_with(engine, config, model_dir, started)
    except RunnerStartError as exc:  # a knob this setup cannot run, named by the message
        print(f"infertune serve: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.close()


def _serve_with(engine: Any, config: ServeConfig, model_dir: Path, started: float) -> int:
    import asyncio  # here, not at the top: the engine core is spawned before the heavier imports

    from tokenizers import Tokenizer

    from infertune.engine.server import EngineServer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    name = config.served_model_name or model_dir.name
    server = EngineServer(engine, tokenizer, model_name=name, model_dir=model_dir)
    info = engine.wait_ready()  # built and warmed up in the core process
    log.info(
        "%s: %s, %d KV blocks of %d tokens, weights %.1f MiB; ready in %.2f s",
        name,
        config.quantization,
        info.num_kv_blocks,
        config.kv_block_size,
        info.weight_bytes / 2**20,
        time.perf_counter() - started,
    )
    try:
        asyncio.run(_serve(server, config.host, config.port))
    except OSError as exc:  # e.g. the port is taken
        print(
            f"infertune serve: cannot listen on {config.host}:{config.port}: {exc}",
            file=sys.stderr,
        )
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
