"""Process and path helpers shared by the dev cluster: build, ports, cleanup of crashed runs."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE_BIN = Path(os.environ.get("INFERTUNE_CACHE", Path.home() / ".cache" / "infertune")) / "bin"
# tmpfs keeps etcd's fsyncs cheap; every instance takes a private mkdtemp directory inside it.
SHM = Path("/dev/shm")  # noqa: S108
STATE_ROOT = SHM if SHM.is_dir() else Path(tempfile.gettempdir())
STATE_PREFIX = "infertune-devcluster-"


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the process that started it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(log: Callable[[str], None] = print) -> None:
    """Run build.sh when a binary is missing (the first build takes ~6 minutes on 2 cores)."""
    missing = [
        b
        for b in ("etcd", "kube-apiserver", "kube-controller-manager")
        if not (CACHE_BIN / b).exists()
    ]
    if not missing and (shutil.which("kubectl") or (CACHE_BIN / "kubectl").exists()):
        return
    log(f"devcluster: building {', '.join(missing) or 'kubectl'} (first time only, ~6 min)...")
    proc = subprocess.run(["bash", str(HERE / "build.sh")], check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/devcluster/build.sh failed with exit code {proc.returncode}")


def build_node(log: Callable[[str], None] = print) -> None:
    """Run ``build.sh node`` when kubelet, kube-scheduler or kube-proxy is missing (~2 min on top
    of the control plane's build: the Go build cache is shared)."""
    if all((CACHE_BIN / b).exists() for b in ("kubelet", "kube-scheduler", "kube-proxy")):
        return
    log("devcluster: building kubelet, kube-scheduler, kube-proxy (first time only, ~2 min)...")
    proc = subprocess.run(["bash", str(HERE / "build.sh"), "node"], check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"scripts/devcluster/build.sh node failed with exit code {proc.returncode}"
        )


def kubectl_path() -> str:
    for candidate in (CACHE_BIN / "kubectl", shutil.which("kubectl")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise FileNotFoundError("kubectl not found on PATH nor in ~/.cache/infertune/bin; run build.sh")


def pid_alive(pid: int) -> bool:
    """False once the process is gone or a zombie (PID 1 here may never reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _is_pod_process(pid: int) -> bool:
    try:
        return b"INFERTUNE_PATH_MAP=" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def reap_stale() -> None:
    """Remove state dirs of instances whose owner died, killing what they left running."""
    for d in STATE_ROOT.glob(f"{STATE_PREFIX}*"):
        info = d / "pids.json"
        try:
            data = json.loads(info.read_text())
        except (OSError, ValueError):
            continue
        if data.get("detached") or pid_alive(int(data.get("owner", 0))):
            continue
        # A pod's process group is killed only if its leader still carries the agent's marker
        # variable: a recycled pid must never be hit.
        pod_groups = [
            int(p.name)
            for p in (d / "pod-pgids").glob("*")
            if p.name.isdigit() and _is_pod_process(int(p.name))
        ]
        for pid in [*data.get("pids", {}).values(), *pod_groups]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(pid), signal.SIGKILL)
        shutil.rmtree(d, ignore_errors=True)


def stop_recorded(state: Path, grace: float = 5.0) -> None:
    """Stop an instance from its pids.json (the detached `up` case): TERM, wait, KILL, remove."""
    data = json.loads((state / "pids.json").read_text())
    pids = data.get("pids", {})
    for name in ("node-agent", "kube-controller-manager", "kube-apiserver", "etcd"):
        if name not in pids:
            continue
        pid = int(pids[name])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    # The agent kills its pods on SIGTERM; this catches any it could not.
    for marker in (state / "pod-pgids").glob("*"):
        if marker.name.isdigit() and _is_pod_process(int(marker.name)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(marker.name), signal.SIGKILL)
    shutil.rmtree(state, ignore_errors=True)


def stop_group(proc: subprocess.Popen[bytes] | None, grace: float = 5.0) -> None:
    """SIGTERM the process group, SIGKILL what is left after `grace` seconds."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
