"""Faults inside tuning, on the real control plane with the real tuner and the real engine (slow):

- the tuning pod is SIGKILLed mid-study: the Job (built by the operator's own builder, the
  storage URL from a Secret) starts a new pod, which resumes the study from a real PostgreSQL;
  no completed trial is lost, the interrupted one is failed by its stale heartbeat;
- the engine of a trial crashes (SIGSEGV), is OOM-killed by a real memory cgroup limit, or hangs
  (SIGSTOP): each is a failed trial with the reason, and the study goes on to its budget.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from cluster_helpers import alive
from fault_helpers import descendants, engine_pids, memory_cap, oom_kills, pod_pid
from kubernetes import client
from operator_harness import wait_for
from services import Postgres

from infertune.operator.api import InferenceService
from infertune.operator.builders import RunPlan, desired_job, desired_spec_configmap
from infertune.operator.builders.job import pod_tuning_spec
from infertune.operator.hashing import run_hash, tuning_hash
from infertune.operator.settings import OperatorSettings
from infertune.tuner.study import storage_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
CLI = (sys.executable, "-c", "import sys; from infertune.cli import main; sys.exit(main())")

SEARCH = {
    "engines": ["builtin"],
    "quantizations": ["fp32", "int8"],
    "maxNumSeqs": {"values": [1, 4, 8]},
    "maxNumBatchedTokens": {"values": [128, 256]},
    "kvBlockSizes": [16],
    "cudaGraph": [False],
    "seed": 1,
}
# Loose bounds: the tiny model meets them on a busy 2-core machine, so every trial that is not
# broken on purpose is an ordinary, feasible measurement.
SLO = {"ttft": {"max": "5s", "percentile": "p95"}, "itl": {"max": "2s", "percentile": "p95"}}
TRAFFIC = {
    "rate": 4,
    "promptTokens": {"distribution": "fixed", "mean": 32},
    "outputTokens": {"distribution": "fixed", "mean": 16},
    "numRequests": 48,
    "warmupRequests": 1,
}


def job_pods(api: Any, namespace: str, job: str) -> list[Any]:
    return list(
        client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"job-name={job}").items
    )


def job_done(api: Any, namespace: str, job: str) -> Any:
    j = client.BatchV1Api(api).read_namespaced_job(job, namespace)
    for c in j.status.conditions or []:
        if c.type in ("Complete", "Failed") and c.status == "True":
            return j
    return None


def running_pod_pid(api: Any, agent: Any, namespace: str, job: str) -> tuple[str, int] | None:
    for p in job_pods(api, namespace, job):
        if p.status.phase == "Running":
            pid = pod_pid(agent, namespace, p.metadata.name)
            if pid is not None:
                return p.metadata.name, pid
    return None


def termination_summary(api: Any, namespace: str, job: str) -> dict[str, Any]:
    for p in job_pods(api, namespace, job):
        if p.status.phase == "Succeeded":
            message = p.status.container_statuses[0].state.terminated.message
            return dict(json.loads(message))
    raise AssertionError(f"no succeeded pod for Job {job}")


def kill_tree(pid: int) -> None:
    """What a node does to a dead pod's cgroup: every process in it, engines included."""
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


# ------------------------------------------------------------------ tuner pod killed mid-study


def test_tuner_pod_killed_mid_study_resumes_from_postgres_without_losing_trials(
    cluster: Any, api: Any, agent: Any, namespace: str, tmp_path: Path
) -> None:
    pg = Postgres().start()
    try:
        core = client.CoreV1Api(api)
        core.create_namespaced_secret(
            namespace, {"metadata": {"name": "study-storage"}, "stringData": {"url": pg.url}}
        )
        doc = {
            "apiVersion": "infertune.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "resumable"},
            "spec": {
                "model": {"uri": "builtin://tiny", "name": "tiny-llama"},
                "slo": SLO,
                "traffic": TRAFFIC,
                "search": SEARCH,
                "quality": {"enabled": False},
                "budget": {"maxTrials": 5, "maxDuration": "20m", "trialTimeout": "2m"},
                "hardware": {"gpuProducts": ["NVIDIA-A100-SXM4-80GB"], "gpusPerReplica": 0, "cpu": "1", "memory": "2Gi"},
            },
        }  # fmt: skip
        path = tmp_path / "isvc.yaml"
        path.write_text(yaml.safe_dump(doc))
        cluster.kubectl(
            "apply", "-n", namespace, "-f", str(path)
        )  # owner of the Job (no operator runs)
        live = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "infertune.dev", "v1alpha1", namespace, "inferenceservices", "resumable"
        )
        isvc = InferenceService.model_validate({**doc, "metadata": live["metadata"]})
        # Exactly what the operator creates with `--storage-secret study-storage`.
        settings = OperatorSettings(
            storage_secret="study-storage", infertune_command=CLI, job_backoff_limit=2
        )
        tuning = pod_tuning_spec(isvc.spec.tuning_spec())
        plan = RunPlan(run_id="fault001", spec_hash=tuning_hash(isvc.spec), run_hash=run_hash(tuning, None),
                       reason="Created", tuning=tuning)  # fmt: skip
        job_name, study_name = plan.job_name("resumable"), plan.study_name(namespace, "resumable")
        job = desired_job(isvc, plan, settings)
        assert (
            "$(INFERTUNE_STORAGE_URL)"
            in job["spec"]["template"]["spec"]["containers"][0]["command"]
        )
        core.create_namespaced_config_map(namespace, desired_spec_configmap(isvc, job_name, tuning))
        client.BatchV1Api(api).create_namespaced_job(namespace, job)

        # Kill the pod while its second trial runs: one trial done, one in flight.
        pod_name, pid = wait_for(
            lambda: running_pod_pid(api, agent, namespace, job_name), "tuner pod", timeout=120
        )
        wait_for(lambda: "trial 1/5" in agent.pod_log(namespace, pod_name) or None,
                 "first trial done", timeout=600, every=1.0)  # fmt: skip
        time.sleep(4)
        kill_tree(pid)
        study = optuna.load_study(study_name=study_name, storage=storage_for(pg.url))
        before = {t.number: t for t in study.get_trials()}
        done_before = {n: t.values for n, t in before.items() if t.state.name == "COMPLETE"}
        running = [n for n, t in before.items() if t.state.name == "RUNNING"]
        assert len(done_before) >= 1 and len(running) == 1, {n: t.state for n, t in before.items()}

        # The Job retries (backoffLimit) and the new pod carries on with the same study.
        wait_for(lambda: job_done(api, namespace, job_name), "Job finished", timeout=900, every=2.0)
        final = client.BatchV1Api(api).read_namespaced_job(job_name, namespace)
        log = agent.pod_log(namespace, job_pods(api, namespace, job_name)[-1].metadata.name)
        assert final.status.succeeded == 1 and final.status.failed == 1, log[-3000:]
        summary = termination_summary(api, namespace, job_name)
        assert summary["status"] == "succeeded", summary
        assert summary["trialsCompleted"] == 5  # the budget, in full

        after = {
            t.number: t
            for t in optuna.load_study(
                study_name=study_name, storage=storage_for(pg.url)
            ).get_trials()
        }
        for number, values in done_before.items():  # nothing measured before the kill was lost
            assert after[number].state.name == "COMPLETE" and after[number].values == values
        interrupted = after[running[0]]
        assert interrupted.state.name == "FAIL"
        assert interrupted.user_attrs.get("failed_by_heartbeat") is True
        assert "heartbeat" in interrupted.user_attrs.get("failure_reason", "")
        assert not [t for t in after.values() if t.state.name == "RUNNING"]
        if interrupted.params:  # its configuration was measured again
            assert any(t.user_attrs.get("retry_of") == interrupted.number for t in after.values())
    finally:
        pg.stop()


# ------------------------------------------------------------------ engine crash, OOM, hang


def _endpoint(pid: int) -> str | None:
    """http://host:port of the engine `pid`, from its command line."""
    match = re.search(r"--host (\S+) .*--port (\d+)", " ".join(_argv(pid)))
    return None if match is None else f"http://{match[1]}:{match[2]}"


def _served(pid: int) -> int:
    """Requests the engine `pid` has finished (from its own /metrics)."""
    url = _endpoint(pid)
    if url is None:
        return 0
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:e2e_request_latency_seconds_count")))  # fmt: skip


def _force_allocation(pid: int) -> None:
    """A long prompt straight to the engine `pid`, in the background: its prefill needs megabytes
    of fresh activations, so a memory cap is hit now rather than whenever the trial's own small
    requests happen to grow the heap (they may not before the trial ends)."""
    url = _endpoint(pid)
    if url is None:
        return
    body = json.dumps({"prompt": "word " * 1500, "max_tokens": 8, "ignore_eos": True}).encode()
    req = urllib.request.Request(
        f"{url}/v1/completions", body, {"Content-Type": "application/json"}
    )

    def send() -> None:
        with contextlib.suppress(OSError):
            urllib.request.urlopen(req, timeout=60).read()

    threading.Thread(target=send, daemon=True).start()


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def test_engine_crash_oom_and_hang_are_failed_trials_with_reasons_and_the_study_goes_on(
    cluster: Any, api: Any, agent: Any, namespace: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    spec = {
        "model": {"uri": "builtin://tiny", "name": "tiny"},
        "slo": SLO,
        "traffic": TRAFFIC,
        "search": SEARCH,
        "quality": {"enabled": False},
        "budget": {"maxTrials": 4, "trialTimeout": "45s"},
    }
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "spec"}, "data": {"spec.yaml": yaml.safe_dump(spec)}}
    )
    argv = [*CLI, "tune", "/etc/spec/spec.yaml", "--study-name", "engine-faults", "--no-profile",
            "--out", "/out", "--termination-message", "/dev/termination-log"]  # fmt: skip
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "engine-faults"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "tuner", "image": "local", "command": argv,
                        "terminationMessagePath": "/dev/termination-log",
                        "volumeMounts": [{"name": "spec", "mountPath": "/etc/spec"},
                                         {"name": "out", "mountPath": "/out"}],
                    }],
                    "volumes": [{"name": "spec", "configMap": {"name": "spec"}},
                                {"name": "out", "hostPath": {"path": str(out)}}],
                }
            },
        },
    }  # fmt: skip
    client.BatchV1Api(api).create_namespaced_job(namespace, job)
    _, tuner = wait_for(
        lambda: running_pod_pid(api, agent, namespace, "engine-faults"), "tuner pod", timeout=120
    )
    handled: list[int] = []
    frozen: list[int] = []
    try:
        for fault in ("crash", "oom", "hang"):
            # The next trial's engine, once the load test is under way.
            engine = wait_for(
                lambda: next((e for e in engine_pids(tuner) if e not in handled and _served(e) >= 3), None),
                f"engine of the {fault} trial serving", timeout=300, every=0.5,
            )  # fmt: skip
            handled.append(engine)
            if fault == "crash":
                os.kill(engine, signal.SIGSEGV)
            elif fault == "oom":
                # The server and its model-runner process, as one container's cgroup holds them.
                tree = [engine, *descendants(engine)]
                with memory_cap(tree, headroom_bytes=256 << 10) as group:
                    _force_allocation(engine)
                    wait_for(
                        lambda e=engine: not alive(e) or None, "engine OOM-killed", timeout=120
                    )
                    # The runner (it holds the model) first; the server may follow it.
                    assert oom_kills(group) >= 1
            else:
                os.kill(
                    engine, signal.SIGSTOP
                )  # alive, answering nothing: only the timeout ends it
                frozen.append(engine)
        wait_for(
            lambda: job_done(api, namespace, "engine-faults"),
            "study finished",
            timeout=600,
            every=2.0,
        )
        left = [p for p in handled if alive(p)]  # the tuner stops what it started, frozen ones too
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    summary = termination_summary(api, namespace, "engine-faults")
    result = json.loads((out / "result.json").read_text())
    trials = {t["number"]: t for t in result["trials"]}
    failed = [trials[n] for n in sorted(trials) if trials[n]["outcome"] == "failed"]
    reasons = [t["reason"] for t in failed]
    assert len(failed) == 3, json.dumps(result["trials"], indent=1)[:4000]
    assert reasons[0].startswith("crash:") and "exit -11" in reasons[0], reasons
    assert reasons[1].startswith("oom:") and "exit -9" in reasons[1], reasons
    assert reasons[2].startswith("timeout:") and "trialTimeout=45s" in reasons[2], reasons
    # The study went on: the budget was spent and the last trial ran normally and was measured
    # (whether it met the SLO depends on how busy the machine is: succeeded or infeasible).
    assert summary["trialsCompleted"] == 4 and summary["status"] in ("succeeded", "infeasible"), (
        summary
    )
    assert any(t["outcome"] in ("ok", "stopped") and t["figures"] for t in trials.values())
    assert not left, left
