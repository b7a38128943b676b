"""Real Prometheus and PostgreSQL servers on loopback, from Debian's packages, for tests and the demo.

Both are installed with apt-get when missing (CI starts from a fresh machine), run from a private
directory under /dev/shm, bind to 127.0.0.1 on a free port, and are stopped with their process group.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def apt_install(*packages: str) -> None:
    """Install Debian packages once (needs root, as on the developer machines and CI here)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lists = Path("/var/lib/apt/lists")
    if not any(lists.glob("*Packages*")):
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    if subprocess.run(cmd, env=env, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
        subprocess.run(cmd, env=env, check=True)


def _wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}; log:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 (loopback only)
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout}s; log:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Prometheus:
    """`prometheus` scraping the given jobs; `scrape_configs` are Prometheus' own YAML objects."""

    def __init__(self, scrape_configs: list[dict[str, Any]], scrape_interval: str = "2s") -> None:
        self.scrape_configs = scrape_configs
        self.scrape_interval = scrape_interval
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="infertune-prom-", dir="/dev/shm"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            apt_install("prometheus")
            binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        config = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": "5s"},
            "scrape_configs": self.scrape_configs,
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        log = self.dir / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_http(f"{self.url}/-/ready", timeout, self.proc, log)
        return self

    def stop(self) -> None:
        _stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class Postgres:
    """A throw-away PostgreSQL 15 cluster owned by the `postgres` user, trust auth on loopback."""

    def __init__(self, database: str = "optuna") -> None:
        self.database = database
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="infertune-pg-", dir="/dev/shm"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def _as_postgres(self, *argv: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)

    def start(self, timeout: float = 60) -> Postgres:
        if not (PG_BIN / "initdb").exists():
            apt_install("postgresql")
        data = self.dir / "data"
        shutil.chown(self.dir, "postgres", "postgres") if os.geteuid() == 0 else None
        subprocess.run(
            self._as_postgres(
                str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"
            ),
            check=True,
            capture_output=True,
        )
        self.port = free_port()
        log = self.dir / "postgres.log"
        log.touch()
        shutil.chown(log, "postgres", "postgres") if os.geteuid() == 0 else None
        argv = [
            str(PG_BIN / "postgres"), "-D", str(data), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}",
            "-c", "max_connections=200", "-c", "fsync=off",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            self._as_postgres(*argv),
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        ready = [str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)]
        while subprocess.run(ready, capture_output=True, check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start; log:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        subprocess.run(
            [
                str(PG_BIN / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                self.database,
            ],
            check=True,
            capture_output=True,
        )
        return self

    def stop(self) -> None:
        _stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
