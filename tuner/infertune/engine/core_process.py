"""The engine-core process's entry: ``python -m infertune.engine.core_process FD``
(started by :func:`infertune.engine.core_spawn.spawn_core`).

It asks Linux to end it with its parent, imports torch before the engine's own modules, while the
server process imports its own and sends the recipe, and then hands the socket to the core's
loop, :func:`infertune.engine.engine_core.run_core`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

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

    from infertune.engine.engine_core import run_core

    run_core(Connection(fd), torch_import_s)


if __name__ == "__main__":  # the engine-core process: `python -m infertune.engine.core_process FD`
    # Through the module's real name, so nothing it defines is pickled as `__main__.*`.
    from infertune.engine import core_process

    core_process._core_main(int(sys.argv[1]))
