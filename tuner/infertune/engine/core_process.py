"""Spawning the engine-core process, kept apart from :mod:`infertune.engine.engine_core` (and its
asyncio, scheduler and engine imports) so that ``infertune serve`` can start the core first.

Why: start-up is the core's ``import torch`` (2-4 s on the CPUs measured here) plus the model
build; everything the server process does before the spawn (its own imports, reading the config,
~0.3 s here) otherwise adds to that critical path. The core's entry is here too, so that it
imports torch before the engine's own modules and while the server sends the recipe
(``python -m infertune.engine.core_process FD``); ``engine_core._child_main`` takes over from there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

__all__ = ["CoreProcess", "spawn_core"]


@dataclass
class CoreProcess:
    """A started engine-core process and the server's end of its socket pair."""

    proc: subprocess.Popen[bytes]
    sock: socket.socket

    def kill(self) -> None:
        """For a core never handed to a ``RemoteEngine`` (the server failed before that)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        self.proc.kill()
        self.proc.wait()


def spawn_core() -> CoreProcess:
    # A plain child process over a socket pair, not multiprocessing's spawn: that also starts a
    # resource-tracker process (which outlives a killed server by a moment and ignores SIGTERM)
    # and shows the runner in `ps` as `spawn_main`.
    ours, theirs = socket.socketpair()
    with theirs:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infertune.engine.core_process", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
        )
    return CoreProcess(proc, ours)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (even by SIGKILL)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the closed pipe still ends the child
        return
    if os.getppid() == 1:  # the parent already died before the request took effect
        os._exit(1)


def _core_main(fd: int) -> None:
    _die_with_parent()
    started = time.perf_counter()
    # Every runner is a torch model, and this import is most of start-up: first, before the
    # engine's own modules, while the server process imports its own and reads the config.
    import torch  # noqa: F401

    torch_import_s = time.perf_counter() - started
    from multiprocessing.connection import Connection

    from infertune.engine.engine_core import _child_main

    _child_main(Connection(fd), torch_import_s)


if __name__ == "__main__":  # the engine-core process: `python -m infertune.engine.core_process FD`
    # Through the module's real name, so nothing it defines is pickled as `__main__.*`.
    from infertune.engine import core_process

    core_process._core_main(int(sys.argv[1]))
