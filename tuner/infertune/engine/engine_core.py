"""The engine core's loop, in a process of its own (scheduler, KV blocks and model), so the
forward pass never waits for the GIL and the HTTP server never sits on the step's critical path.

A decode step is some 200 torch ops, and each one releases and re-takes the GIL. With the
runner on a thread of the HTTP server's process, every re-take waits while the event loop
formats and writes tokens: measured on this 2-core machine at concurrency 8, a batch-8
decode step took 9.0 ms under HTTP load against 5.6 ms alone. A CPU-bound process on the
other core did not slow it, so the cost was the shared GIL.

A first split moved only the model runner out (one pickle round trip per step). Under HTTP load
at concurrency 8 the runner then sat idle 1.1 ms of every 9 ms step: the server's engine thread
had to wake, update the scheduler, hand tokens to the event loop and schedule the next step
before the runner could go on. So, as vLLM V1's EngineCore, the whole engine runs here:
:func:`run_core` reads requests and aborts from the socket between calls of
:meth:`~infertune.engine.engine.Engine.step` (blocking on it only when there is nothing to
step), and ships each step's tokens (with the gauges for /metrics) up in one message that the
server's receiver thread (:mod:`infertune.engine.core_client`) hands to the event loop.

The process starts at :mod:`infertune.engine.core_process` (which imports torch first); it gets
its :class:`~infertune.engine.serve_config.ServeConfig` from the server, builds the runner and
warms it up while the parent starts its server, and exits when the socket closes. The messages
are listed in :mod:`infertune.engine.core_messages`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path

from infertune.engine.build import build_runner
from infertune.engine.core_messages import RunnerInfo
from infertune.engine.engine import Engine, EngineStats, Request, TokenEvent
from infertune.engine.serve_config import ServeConfig

__all__ = ["run_core"]

log = logging.getLogger(__name__)


def run_core(conn: Connection, torch_import_s: float) -> None:
    """The engine-core process, after ``core_process``'s entry set PDEATHSIG and imported torch."""
    waiting = time.perf_counter()
    try:
        config, model_dir = conn.recv()
    except (EOFError, OSError):  # the server died before it sent the recipe
        return
    assert isinstance(config, ServeConfig) and isinstance(model_dir, Path)
    logging.basicConfig(
        level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    log.info(
        "engine core: torch imported in %.2f s; then waited %.2f s for the server's recipe",
        torch_import_s,
        time.perf_counter() - waiting,
    )
    # The server decides when to stop (Ctrl-C or SIGTERM to the process group): it finishes
    # its shutdown and then closes the socket, which ends this loop. A parent that dies without
    # doing so takes this process with it (PDEATHSIG).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        runner = build_runner(config, model_dir)
    except (ValueError, SystemExit, OSError) as exc:  # a knob or path this setup cannot use
        conn.send(("error", str(exc)))
        return
    engine = Engine(runner, **config.engine_kwargs(runner.config))
    engine.warmup()
    conn.send(("ready", RunnerInfo(runner.num_kv_blocks, runner.block_size, runner.weight_bytes())))
    sent: EngineStats | None = None

    def ship(events: list[tuple[Request, TokenEvent]]) -> None:
        """One message per step: its events and the gauges (none if nothing changed)."""
        nonlocal sent
        stats = replace(engine.stats)  # a copy: the engine goes on updating its own
        if events or stats != sent:
            sent = stats
            with contextlib.suppress(BrokenPipeError, OSError):  # the server is gone; EOF ends us
                conn.send(([(req.seq.seq_id, event) for req, event in events], stats))

    try:
        while True:
            # Idle: wait for the server. Busy: take whatever has arrived, then step.
            while not engine.has_work or conn.poll():
                message = conn.recv()
                if message[0] == "add":
                    engine.submit(message[1], message[2])
                elif message[0] == "abort":
                    engine.abort(message[1])
            try:
                ship(engine.step())
            except Exception:  # a bug here must not leave every client hanging forever
                log.exception("engine loop failed; aborting all requests")
                ship(engine.fail_all("internal engine error"))
    except (EOFError, OSError):  # the server closed the socket or died
        return
    finally:
        ship(engine.fail_all("the engine stopped"))
