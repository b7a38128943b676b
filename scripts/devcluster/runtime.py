"""One container as a local process: start, restart with back-off, probes, kill, status.

The process runs in its own session (process group) so that deleting the pod kills everything
it started. Probes (httpGet, tcpSocket, exec) follow the kubelet's defaults and thresholds;
statuses use the API's containerStatuses shape so the ReplicaSet, Job and endpoints
controllers (and the operator) see exactly what a kubelet would report.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.client
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
MAX_MESSAGE = 4096  # the kubelet's cap on a termination message


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Probe:
    spec: Obj
    pod_ip: str
    ports: dict[str, int]
    env: dict[str, str]
    cwd: Path
    successes: int = 0
    failures: int = 0
    last_run: float = 0.0
    result: bool | None = None  # None until the first verdict

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds") or 10)

    def _port(self, value: int | str) -> int:
        if isinstance(value, int) or str(value).isdigit():
            return int(value)
        if value not in self.ports:
            raise ValueError(f"probe names port {value!r} that the container does not declare")
        return self.ports[str(value)]

    def _check(self) -> bool:
        timeout = float(self.spec.get("timeoutSeconds") or 1)
        if "httpGet" in self.spec:
            h = self.spec["httpGet"]
            cls = (
                http.client.HTTPSConnection
                if h.get("scheme") == "HTTPS"
                else http.client.HTTPConnection
            )
            conn = cls(h.get("host") or self.pod_ip, self._port(h["port"]), timeout=timeout)
            try:
                headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
                conn.request("GET", h.get("path") or "/", headers=headers)
                return 200 <= conn.getresponse().status < 400
            finally:
                conn.close()
        if "tcpSocket" in self.spec:
            t = self.spec["tcpSocket"]
            with socket.create_connection(
                (t.get("host") or self.pod_ip, self._port(t["port"])), timeout=timeout
            ):
                return True
        if "exec" in self.spec:
            proc = subprocess.run(
                self.spec["exec"]["command"],
                env=self.env,
                cwd=self.cwd,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            return proc.returncode == 0
        raise ValueError(f"probe has none of httpGet, tcpSocket, exec: {sorted(self.spec)}")

    def tick(self, started_at: float, now: float) -> bool | None:
        """Run the probe when due; returns the current verdict (None: no verdict yet)."""
        if (
            now - started_at < float(self.spec.get("initialDelaySeconds") or 0)
            or now - self.last_run < self.period
        ):
            return self.result
        self.last_run = now
        try:
            ok = self._check()
        except (OSError, ValueError, subprocess.TimeoutExpired, http.client.HTTPException):
            ok = False
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold") or 1):
                self.result = True
        else:
            self.successes, self.failures = 0, self.failures + 1
            if self.failures >= int(self.spec.get("failureThreshold") or 3):
                self.result = False
        return self.result


@dataclass
class Container:
    spec: Obj
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    termination_path: Path
    pod_ip: str
    restart_policy: str
    backoff: tuple[float, float] = (1.0, 20.0)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    started_iso: str = ""
    restart_count: int = 0
    state: Obj = field(default_factory=dict)
    last_state: Obj = field(default_factory=dict)
    next_start: float = 0.0
    done: bool = False  # terminated and will not be restarted
    ready: bool = False
    probes: dict[str, Probe] = field(default_factory=dict)
    pgids: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.termination_path.unlink(missing_ok=True)
        self.started_at, self.started_iso = time.monotonic(), now_iso()
        try:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    self.argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
        except OSError as e:
            # What a runtime reports for a missing executable: StartError, exit code 128.
            self._finish(128, "StartError", f"{self.argv[0]}: {e.strerror or e}", pid=0)
            return
        self.pgids.append(self.proc.pid)
        self.state = {"running": {"startedAt": self.started_iso}}
        ports = {
            p["name"]: int(p["containerPort"])
            for p in self.spec.get("ports") or []
            if p.get("name")
        }
        self.probes = {
            kind: Probe(self.spec[kind], self.pod_ip, ports, self.env, self.cwd)
            for kind in ("startupProbe", "readinessProbe", "livenessProbe")
            if self.spec.get(kind)
        }

    def _termination_message(self, exit_code: int) -> str:
        with contextlib.suppress(OSError):
            data = self.termination_path.read_bytes()[:MAX_MESSAGE]
            if data:
                return data.decode(errors="replace")
        if exit_code != 0 and self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with contextlib.suppress(OSError):
                lines = self.log_path.read_bytes().decode(errors="replace").splitlines()[-80:]
                return "\n".join(lines)[-2048:]
        return ""

    def _on_exit(self, code: int) -> None:
        assert self.proc is not None
        killed_by = -code if code < 0 else 0
        exit_code = 128 + killed_by if killed_by else code
        reason = "Completed" if exit_code == 0 else "Error"
        self._finish(
            exit_code, reason, self._termination_message(exit_code), self.proc.pid, killed_by
        )

    def _finish(
        self, exit_code: int, reason: str, message: str, pid: int, signal_no: int = 0
    ) -> None:
        """Record a terminated instance; schedule a restart if the policy asks for one."""
        now = time.monotonic()
        term: Obj = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": self.started_iso,
            "finishedAt": now_iso(),
            "containerID": f"local://{pid}",
        }
        if signal_no:
            term["signal"] = signal_no
        if message:
            term["message"] = message
        self.proc, self.ready = None, False
        restart = self.restart_policy == "Always" or (
            self.restart_policy == "OnFailure" and exit_code != 0
        )
        if not restart:
            # lastState keeps the previous instance's end, as the kubelet reports it.
            self.done = True
            self.state = {"terminated": term}
            return
        self.last_state = {"terminated": term}
        delay = min(self.backoff[0] * 2**self.restart_count, self.backoff[1])
        self.next_start = now + delay
        self.state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:g}s restarting failed container={self.name}",
            }
        }

    def tick(self, now: float) -> None:
        """Advance: notice exits, restart after back-off, run probes, kill on failed liveness."""
        if self.done:
            return
        if self.proc is None:
            if now >= self.next_start:
                self.restart_count += 1
                self.start()
            return
        code = self.proc.poll()
        if code is not None:
            self._on_exit(code)
            return
        startup = self.probes.get("startupProbe")
        if startup is not None and startup.result is not True:
            verdict = startup.tick(self.started_at, now)
            if verdict is False:
                self.kill(0)
            self.ready = False
            return
        liveness = self.probes.get("livenessProbe")
        if liveness is not None and liveness.tick(self.started_at, now) is False:
            self.kill(float(self.spec.get("terminationGracePeriodSeconds") or 2))
            return
        readiness = self.probes.get("readinessProbe")
        self.ready = True if readiness is None else readiness.tick(self.started_at, now) is True

    def kill(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; records the exit."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)
        # Whatever the leader did, nothing of the group may survive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        code = self.proc.wait()
        self._on_exit(code)

    def stop(self, grace: float) -> None:
        """Kill for good (pod deleted): no restart afterwards."""
        self.restart_policy = "Never"
        self.kill(grace)
        self.done = True

    def status(self) -> Obj:
        out: Obj = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.proc is not None,
            "restartCount": self.restart_count,
            "state": self.state or {"waiting": {"reason": "PodInitializing"}},
            "lastState": self.last_state,
        }
        if self.proc is not None:
            out["containerID"] = f"local://{self.proc.pid}"
        return out
