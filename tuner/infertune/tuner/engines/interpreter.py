"""Which Python runs an engine that lives in its own interpreter (a venv in the tuner image, the
system Python of the engine's image), and whether that interpreter has the engine.

Asked of the engine's own interpreter, never the tuner's: the tuner-full image keeps vLLM and
SGLang in /opt/engines/<name> venvs (docker/Dockerfile.tuner), so ``find_spec`` in the tuner's
process says nothing about them.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

IMAGE_PYTHON = "python3"


def configured_python(python_env: str, venv_env: str, default: str = IMAGE_PYTHON) -> str:
    """``$<python_env>`` (an interpreter), else ``$<venv_env>/bin/python``, else `default`."""
    explicit = os.environ.get(python_env)
    if explicit:
        return explicit
    venv = os.environ.get(venv_env)
    if venv:
        return str(Path(venv) / "bin/python")
    return default


@functools.lru_cache(maxsize=16)
def has_module(python: str, module: str) -> bool:
    """Whether `python` exists and can find `module` (find_spec, not import: importing an engine
    takes many seconds and may touch the GPU)."""
    exe = shutil.which(python) if os.sep not in python else python
    if exe is None or not Path(exe).exists():
        return False
    probe = f"import importlib.util as u, sys; sys.exit(u.find_spec({module!r}) is None)"
    try:
        return subprocess.run([exe, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
