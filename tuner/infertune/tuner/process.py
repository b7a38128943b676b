"""One engine server process: start from an adapter's argv, wait for health, sample memory, stop.

Only this module (and the llama.cpp converter) starts subprocesses. Failures become a
:class:`TrialError` whose `kind` (crash, oom, timeout, unsupported) the study records.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.base import EngineAdapter, Launch
from infertune.tuner.hardware import Hardware

FAILURE_KINDS = ("crash", "oom", "timeout", "unsupported", "error")
_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cannot allocate memory", "std::bad_alloc")
_UNSUPPORTED_MARKERS = ("unsupportedconfig", "not supported", "is not one of", "needs a cuda")


class TrialError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        self.message = message
        super().__init__(f"{kind}: {message}")


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
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self.peak_bytes = 0

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
        """Peak memory so far: GPU memory of the process (NVML) or the resident set's high-water mark."""
        if self.proc is None:
            return self.peak_bytes
        now = gpu_memory(self.proc.pid) if self.hardware.is_gpu else None
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


def gpu_memory(pid: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # any NVML problem means "not measurable here"; RSS is the fallback
        return None
    try:
        pids = set(_tree(pid))
        used = 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid in pids and proc.usedGpuMemory:
                    used += int(proc.usedGpuMemory)
        return used or None
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


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
