"""The server's side of the engine-core process: :class:`RemoteEngine`, the
:class:`~infertune.engine.engine.EngineFrontend` that ``infertune serve`` hands its HTTP server.

It admits requests in the server process (validation and the ``max_waiting`` bound are answered
here, synchronously, so the server can reply 400/503 at once), sends them down the socket to the
core (:mod:`infertune.engine.engine_core`, which runs the engine; why it is a process of its own
is told there), and a receiver thread feeds each request's asyncio queue from the core's
per-step messages (:mod:`infertune.engine.core_messages`). It starts the core through
:mod:`infertune.engine.core_spawn` and never imports the core's modules (nor torch).

If the core dies, the server process ends by the same signal (or exit code): a supervisor (a
trial, a kubelet) sees what killed the engine, as when both were one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

from infertune.engine.block_manager import BlockManager
from infertune.engine.config import LlamaConfig
from infertune.engine.core_messages import RunnerInfo
from infertune.engine.core_spawn import CoreProcess, spawn_core
from infertune.engine.engine import EngineFrontend, EngineStats, Request, TokenEvent
from infertune.engine.scheduler import Scheduler, Sequence
from infertune.engine.serve_config import ServeConfig

__all__ = ["RemoteEngine", "RunnerStartError"]

log = logging.getLogger(__name__)


class RunnerStartError(RuntimeError):
    """The runner could not be built (a bad knob value, a missing model): the message says why."""


class RemoteEngine(EngineFrontend):
    """The server's handle on the engine-core process: admits requests (validation and the
    ``max_waiting`` bound are answered here, synchronously, so the server can reply 400/503 at
    once), forwards them, and feeds each request's asyncio queue from the core's messages."""

    def __init__(
        self, config: ServeConfig, model_dir: Path, *, core: CoreProcess | None = None
    ) -> None:
        """Serve the checkpoint in ``model_dir`` as ``config`` says; the core builds the runner
        and the engine from both. ``core``: a process :func:`spawn_core` started earlier (it has
        been importing torch); by default one is started here."""
        settings = config.engine_kwargs(LlamaConfig.from_dir(model_dir))
        self.max_model_len = int(settings["max_model_len"])
        self.max_waiting = int(settings["max_waiting"])
        self.eos_token_ids = frozenset(settings["eos_token_ids"])
        self.stats = EngineStats()
        core = core or spawn_core()
        self._proc, ours = core.proc, core.sock
        # Kept to shut the socket down on close: closing the fd alone neither wakes the
        # receiver thread blocked in recv() on it nor lets the child see EOF (the blocked call
        # holds the socket open), so shutdown waited out close()'s 10 s timeout.
        self._sock = ours
        self._conn = Connection(os.dup(ours.fileno()))
        self._conn.send((config, model_dir))
        self._send_lock = threading.Lock()  # callers on any thread share one pipe
        self._info: RunnerInfo | None = None
        self._validator: Scheduler | None = None
        self._ids = itertools.count()
        # seq_id -> (loop, queue) of live requests, and those not yet scheduled (no event yet);
        # both touched under _lock by the event loop and the receiver thread.
        self._lock = threading.Lock()
        self._requests: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue[TokenEvent]]] = {}
        self._unscheduled: set[int] = set()
        self._receiver: threading.Thread | None = None
        self._closing = False
        # An idle server sends nothing down the pipe, so a dead core would go unnoticed (and
        # /health stay green) until the next request: watch the process itself.
        threading.Thread(target=self._watch, name="infertune-core-watch", daemon=True).start()

    # ---- lifecycle ----------------------------------------------------------------------------
    def wait_ready(self) -> RunnerInfo:
        """Block until the child has built and warmed up its engine; :class:`RunnerStartError`
        if it could not (a knob this setup cannot run, named by the message)."""
        if self._info is None:
            kind, payload = self._recv()
            if kind != "ready":
                self.close()
                raise RunnerStartError(str(payload))
            self._info = payload
            blocks = BlockManager(payload.num_kv_blocks, payload.block_size)
            self._validator = Scheduler(
                blocks, max_num_seqs=1, max_num_batched_tokens=1, max_model_len=self.max_model_len
            )
        return self._info

    def warmup(self) -> None:
        self.wait_ready()  # the core warms up before it reports ready

    def start(self) -> None:
        self.wait_ready()
        if self._receiver is None:
            self._receiver = threading.Thread(
                target=self._receive, name="infertune-core-receiver", daemon=True
            )
            self._receiver.start()

    def stop(self) -> None:
        self.close()

    def is_alive(self) -> bool:
        return (
            self._receiver is not None and self._receiver.is_alive() and self._proc.poll() is None
        )

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):  # the child's recv sees EOF; it stops and exits
            self._sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()
        self._sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    # ---- the asyncio side ---------------------------------------------------------------------
    def _validate(self, seq: Sequence) -> None:
        assert self._validator is not None, "start() first"
        self._validator.validate(seq)

    def _admit(self, req: Request) -> None:
        # A request counts as waiting until its first event (the core's gauge lags a step).
        assert req.loop is not None and req.queue is not None
        seq_id = req.seq.seq_id
        with self._lock:
            if len(self._unscheduled) >= self.max_waiting:
                raise self._overloaded()
            self._requests[seq_id] = (req.loop, req.queue)
            self._unscheduled.add(seq_id)
        self._send(("add", req.seq, req.arrival))

    def abort(self, seq_id: int) -> None:
        with self._lock:
            known = self._requests.pop(seq_id, None) is not None
            self._unscheduled.discard(seq_id)
        if known:
            self._send(("abort", seq_id))

    # ---- the receiver thread ------------------------------------------------------------------
    def _receive(self) -> None:
        while True:
            try:
                events, stats = self._conn.recv()
            except (EOFError, ConnectionResetError, OSError):
                if self._closing:
                    return
                self._child_died()
            self.stats.restore(stats)
            by_loop: dict[
                asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[TokenEvent], TokenEvent]]
            ] = {}
            with self._lock:
                for seq_id, event in events:
                    target = self._requests.get(seq_id)
                    if target is None:  # aborted meanwhile: nobody listens
                        continue
                    if event.queue_time is not None or event.finished:
                        self._unscheduled.discard(seq_id)
                    if event.finished:
                        del self._requests[seq_id]
                    by_loop.setdefault(target[0], []).append((target[1], event))
            for loop, batch in by_loop.items():
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening
                    loop.call_soon_threadsafe(_put_each, batch)

    def _send(self, message: Any) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (BrokenPipeError, ConnectionResetError, OSError):
            if not self._closing:
                self._child_died()

    def _recv(self) -> tuple[str, Any]:
        try:
            message: tuple[str, Any] = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            self._child_died()
        return message

    def _watch(self) -> None:
        self._proc.wait()
        # Before "ready" the main thread is reading the pipe and reports the start-up error.
        if not self._closing and self._info is not None:
            self._child_died()

    def _child_died(self) -> NoReturn:
        try:
            code: int | None = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # the pipe broke but the process lingers
            self._proc.kill()
            code = None
        log.critical("the engine core process ended (exit %s); the server stops with it", code)
        sys.stderr.flush()
        if code is not None and code < 0:  # killed by a signal: die of the same one
            sig = -code
            # Those this process handles or ignores (asyncio's stop, Python's Ctrl-C, SIGPIPE)
            # would not end it, and a handler can be reset only on the main thread.
            if sig not in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
                os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(code if code else 1)


def _put_each(batch: list[tuple[asyncio.Queue[TokenEvent], TokenEvent]]) -> None:
    for queue, event in batch:
        queue.put_nowait(event)
