"""The model runner in a process of its own, so the forward pass never waits for the GIL.

A decode step is some 200 torch ops, and each one releases and re-takes the GIL. With the
runner on a thread of the HTTP server's process, every re-take waits while the event loop
formats and writes tokens: measured on this 2-core machine at concurrency 8, a batch-8
decode step took 9.0 ms under HTTP load against 5.6 ms alone. A CPU-bound process on the
other core did not slow it, so the cost was the shared GIL (vLLM V1 moved its engine core
out of the API server's process for the same reason).

The server keeps the scheduler, the block manager and the event loop; only
:meth:`ModelRunner.execute` crosses the pipe (a list of :class:`StepInput` down, one token per
input back), so the scheduler stays the single owner of the KV blocks. The child is a fresh
interpreter (``python -m infertune.engine.runner_process``: CUDA- and OpenMP-safe); it builds
the runner while the parent starts its server, and exits when the pipe closes. If the child dies, the server process ends by the same signal (or exit code):
a supervisor (a trial, a kubelet) sees what killed the engine, as when both were one process.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from infertune.engine.step import StepInput

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class RunnerStartError(RuntimeError):
    """The runner could not be built (a bad knob value, a missing model): the message says why."""


@dataclass(frozen=True)
class RunnerInfo:
    num_kv_blocks: int
    block_size: int
    weight_bytes: int


class RemoteRunner:
    """The :class:`~infertune.engine.engine.Runner` the engine thread calls; runs in a child."""

    def __init__(self, build: str, kwargs: dict[str, Any], log_level: str = "WARNING") -> None:
        """``build`` names ``module:function``; ``function(**kwargs)`` runs in the child and
        returns the runner (by name: the server's own module may be ``__main__``)."""
        # A plain child process over a socket pair, not multiprocessing's spawn: that also
        # starts a resource-tracker process (which outlives a killed server by a moment and
        # ignores SIGTERM) and shows the runner in `ps` as `spawn_main`.
        ours, theirs = socket.socketpair()
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "infertune.engine.runner_process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
            )
        self._conn = Connection(ours.detach())
        self._conn.send((build, kwargs, log_level))
        self._info: RunnerInfo | None = None
        self._closing = False
        # An idle server sends nothing down the pipe, so a dead runner would go unnoticed (and
        # /health stay green) until the next request: watch the process itself.
        threading.Thread(target=self._watch, name="infertune-runner-watch", daemon=True).start()

    def wait_ready(self) -> RunnerInfo:
        """Block until the child has built its runner; :class:`RunnerStartError` if it could not."""
        if self._info is None:
            kind, payload = self._recv()
            if kind != "ready":
                self.close()
                raise RunnerStartError(str(payload))
            self._info = payload
        return self._info

    @property
    def num_kv_blocks(self) -> int:
        return self.wait_ready().num_kv_blocks

    @property
    def block_size(self) -> int:
        return self.wait_ready().block_size

    def weight_bytes(self) -> int:
        return self.wait_ready().weight_bytes

    def execute(self, batch: list[StepInput]) -> list[int | None]:
        self._send(batch)
        kind, payload = self._recv()
        if kind != "ok":  # the step failed in the child; the engine fails this batch only
            raise RuntimeError(str(payload))
        tokens: list[int | None] = payload
        return tokens

    def close(self) -> None:
        self._closing = True
        self._conn.close()  # the child's recv sees EOF and it exits
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _send(self, message: Any) -> None:
        try:
            self._conn.send(message)
        except (BrokenPipeError, ConnectionResetError, OSError):
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
        log.critical("the model runner process ended (exit %s); the server stops with it", code)
        sys.stderr.flush()
        if code is not None and code < 0:  # killed by a signal: die of the same one
            sig = -code
            # Those this process handles or ignores (asyncio's stop, Python's Ctrl-C, SIGPIPE)
            # would not end it, and a handler can be reset only on the main thread.
            if sig not in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
                os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(code if code else 1)


def _child_main(conn: Connection) -> None:
    _die_with_parent()
    try:
        build, kwargs, log_level = conn.recv()
    except (EOFError, OSError):  # the server died before it sent the recipe
        return
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    module, _, name = build.partition(":")
    # The server decides when to stop (Ctrl-C or SIGTERM to the process group): it finishes
    # its shutdown and then closes the pipe, which ends this loop. A parent that dies without
    # doing so takes this process with it (PDEATHSIG).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        runner = getattr(importlib.import_module(module), name)(**kwargs)
    except (ValueError, SystemExit, OSError) as exc:  # a knob or path this setup cannot use
        conn.send(("error", str(exc)))
        return
    conn.send(("ready", RunnerInfo(runner.num_kv_blocks, runner.block_size, runner.weight_bytes())))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):  # the server closed the pipe or died
            return
        try:
            reply: tuple[str, Any] = ("ok", runner.execute(batch))
        except Exception as exc:  # reported per step; the engine fails that batch only
            log.exception("model step failed")
            reply = ("error", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (even by SIGKILL)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the closed pipe still ends the child
        return
    if os.getppid() == 1:  # the parent already died before the request took effect
        os._exit(1)


if __name__ == "__main__":  # the runner process: `python -m infertune.engine.runner_process FD`
    # Through the module's real name, so what it pickles (RunnerInfo) is not `__main__.*`.
    from infertune.engine import runner_process

    runner_process._child_main(Connection(int(sys.argv[1])))
