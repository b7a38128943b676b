"""One engine server process: start from an adapter's argv, wait for health, sample memory, stop;
and :func:`in_child`, which runs the tuner's own GPU work (ceilings, the built-in profile) in a
child process that exits before any engine starts.

Only this module (and the llama.cpp converter) starts subprocesses. Failures become a
:class:`TrialError` whose `kind` (crash, oom, timeout, unsupported) the study records.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import EngineAdapter, Launch
from infertune.tuner.hardware import Hardware

T = TypeVar("T")
ISOLATE_ENV = "INFERTUNE_ISOLATE_GPU_WORK"  # "1": in a child even on CPU; "0": never

FAILURE_KINDS = ("crash", "oom", "timeout", "unsupported", "error")
_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cannot allocate memory", "std::bad_alloc")
_UNSUPPORTED_MARKERS = ("unsupportedconfig", "not supported", "is not one of", "needs a cuda")


class TrialError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")


def isolate_gpu_work(is_gpu: bool) -> bool:
    """Whether the tuner's own torch work runs in a child: on a GPU (``$INFERTUNE_ISOLATE_GPU_WORK``
    overrides either way; tests force it on CPU)."""
    forced = os.environ.get(ISOLATE_ENV)
    return forced == "1" if forced in ("0", "1") else is_gpu


def in_child(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a fresh (spawned, never forked) process that has exited when this
    returns: the CUDA context and PyTorch's cached blocks it held go back to the device. vLLM
    refuses to start when free memory is below its gpu_memory_utilization, so the tuner process
    must hold none while trials run. `fn` and its arguments and result must pickle; an exception
    in the child is raised here."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args, **kwargs).result()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def local_argv(argv: list[str]) -> list[str]:
    """Run the `infertune` console script through this interpreter (no PATH lookup, same venv)."""
    if argv and argv[0] == "infertune" and len(argv) > 1 and argv[1] == "serve":
        return [sys.executable, "-m", "infertune.engine.cli", *argv[1:]]
    return argv


def classify_exit(returncode: int | None, log_tail: str) -> str:
    text = log_tail.lower()
    if any(m in text for m in _OOM_MARKERS) or returncode in (-signal.SIGKILL, 137):
        return "oom"
    if any(m in text for m in _UNSUPPORTED_MARKERS) or returncode == 2:
        return "unsupported"
    return "crash"


class EngineProcess:
    """A running engine for one configuration."""

    def __init__(
        self,
        adapter: EngineAdapter,
        config: Candidate,
        model_path: Path,
        workdir: Path,
        hardware: Hardware,
        *,
        served_model_name: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.adapter = adapter
        self.config = config
        self.hardware = hardware
        self.host = host
        self.port = free_port(host)
        self.launch: Launch = adapter.launch(
            config, str(model_path), host, self.port, served_model_name=served_model_name
        )
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"engine-{config.config_hash}-{self.port}.log"
        # The exact argv beside its log: what the Deployment must run (tests/slow compare them).
        self.log_path.with_suffix(".argv.json").write_text(json.dumps(self.launch.argv))
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self.peak_bytes = 0
        # Per-device used GPU memory before the engine started, and the engine's peak above it.
        self.gpu_baseline: list[int] | None = None
        self.gpu_peak: list[int] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def start(self, timeout: float) -> float:
        """Start and wait for health; the start-up time in seconds, or raise TrialError."""
        argv = local_argv(self.launch.argv)
        env = {**os.environ, **self.launch.env}
        if self.hardware.is_gpu:
            self.gpu_baseline = gpu_used_per_device()
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = started + timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                tail = self.log_tail()
                raise TrialError(
                    classify_exit(code, tail),
                    f"engine exited with code {code} before ready: {_last_lines(tail)}",
                )
            if self._healthy():
                self.startup_s = time.monotonic() - started
                self.sample_memory()
                return self.startup_s
            time.sleep(0.2)
        self.stop()
        raise TrialError(
            "timeout", f"engine not healthy after {timeout:.0f}s: {_last_lines(self.log_tail())}"
        )

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.launch.health_path, timeout=2) as resp:  # noqa: S310 - our own loopback server
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def failure(self) -> TrialError:
        code = None if self.proc is None else self.proc.poll()
        tail = self.log_tail()
        return TrialError(
            classify_exit(code, tail), f"engine died (exit {code}): {_last_lines(tail)}"
        )

    def sample_memory(self) -> int:
        """Peak memory so far: on a GPU, each device's used memory (NVML) above what it used before
        the engine started, summed over devices; else the resident set's high-water mark.

        Per device, not per process: inside a container NVML reports host PIDs (or none), which
        never match the engine's, so matching processes measured nothing."""
        if self.proc is None:
            return self.peak_bytes
        now: int | None = None
        if self.gpu_baseline is not None:
            used = gpu_used_per_device()
            if used is not None:
                self.gpu_peak = peak_above(self.gpu_peak, used, self.gpu_baseline)
                now = sum(self.gpu_peak)
        if now is None:
            now = rss_high_water(self.proc.pid)
        self.peak_bytes = max(self.peak_bytes, now or 0)
        return self.peak_bytes

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def _last_lines(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-600:] or "(no output)"


def _tree(pid: int) -> list[int]:
    out = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            for child in task.read_text().split():
                out.extend(_tree(int(child)))
    return out


def rss_high_water(pid: int) -> int | None:
    """Sum of VmHWM (peak resident set) over the process tree, in bytes."""
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
    return total or None


def gpu_used_per_device() -> list[int] | None:
    """Used memory of each GPU NVML sees, in bytes (None where NVML is not available).

    Every device of the pod: the device plugin gives a container only its GPUs, and a trial's
    engine (with tensor parallelism, several workers) may use any of them."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # any NVML problem means "not measurable here"; RSS is the fallback
        return None
    try:
        return [
            int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used)
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def peak_above(peak: list[int], used: list[int], baseline: list[int]) -> list[int]:
    """Each device's highest use above its baseline so far (a device that came or went counts
    from zero)."""
    above = [max(0, u - (baseline[i] if i < len(baseline) else 0)) for i, u in enumerate(used)]
    return [max(a, peak[i] if i < len(peak) else 0) for i, a in enumerate(above)]


class HealthWatch:
    """Times /health round trips on a thread while a load test runs: how late a saturated engine
    answers the probe the operator's kubelet will send. A probe that times out counts as the
    timeout; `worst_ms` is None when no probe finished."""

    def __init__(self, url: str, *, interval_s: float = 1.0, timeout_s: float = 30.0) -> None:
        import threading

        self.url, self.interval_s, self.timeout_s = url, interval_s, timeout_s
        self.samples_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:  # noqa: S310 - our own loopback server
                    resp.read()
            except (urllib.error.URLError, OSError, TimeoutError):
                if self._stop.is_set():
                    break
            self.samples_ms.append((time.monotonic() - started) * 1000.0)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 1)

    @property
    def worst_ms(self) -> float | None:
        return max(self.samples_ms) if self.samples_ms else None
