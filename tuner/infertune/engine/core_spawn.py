"""Spawning the engine-core process: :func:`spawn_core` and the server's handle on the result.

Kept apart from the client (:mod:`infertune.engine.core_client`, with its asyncio, scheduler and
engine imports) and from the core's own modules, so that ``infertune serve`` can start the core
first. Why: start-up is the core's ``import torch`` (2-4 s on the CPUs measured here) plus the
model build; everything the server process does before the spawn (its own imports, reading the
config, ~0.3 s here) otherwise adds to that critical path.

The child runs ``python -m infertune.engine.core_process FD`` (named here, not imported: the
server process never loads the core's modules, nor torch).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["CORE_ENTRY", "CoreProcess", "spawn_core"]

CORE_ENTRY = "infertune.engine.core_process"


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
            [sys.executable, "-m", CORE_ENTRY, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
        )
    return CoreProcess(proc, ours)
