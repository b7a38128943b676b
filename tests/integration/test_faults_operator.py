"""Faults around the operator, on the real control plane: the operator SIGKILLed mid-tuning and
mid-rollout, the API server crashing under it, write conflicts (409) and throttling (429), and a
serving pod that stalls, crashes and is deleted. The tuning pods run `fault_fake_cli.py` (the
placeholder tuner, held at a gate so "mid-tuning" lasts as long as the test needs); serving pods
run the real engine. The serving-pod test drives live traffic for minutes: marked slow.
Every fault here, what it proves and why is listed in docs/reliability.md."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_helpers import Fault, FaultProxy, kill_operator, pod_pid
from kubernetes import client
from operator_harness import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorProcess,
    explained,
    operator_kubeconfig,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families
from test_operator_flow import LABEL, apply, condition, demo, isvc, jobs, wait_phase

from infertune.operator.histograms import E2E, parse_exposition

pytestmark = pytest.mark.cluster
FAULT_CLI = Path(__file__).resolve().parent / "fault_fake_cli.py"
# No GPU for serving: a previous test's pods (namespaces are deleted without waiting) may still
# hold the fake node's GPU; the tuning Job still lands on the H100 node by its product label.
HARDWARE = {
    "gpuProducts": ["NVIDIA-H100-80GB-HBM3"],
    "gpusPerReplica": 0,
    "cpu": "1",
    "memory": "2Gi",
}


def release(gate: Path) -> None:
    (gate / "release").touch()


def operator_for(
    cluster: Any, api: Any, namespace: str, tmp_path: Path, server: str | None = None
) -> OperatorProcess:
    kubeconfig = operator_kubeconfig(cluster, api, tmp_path)
    if server is not None:  # talk to the API server through a proxy
        kubeconfig.write_text(kubeconfig.read_text().replace(cluster.server, server))
    args = ("--namespace", namespace, "--infertune-command", f"{sys.executable} {FAULT_CLI}")
    return OperatorProcess(kubeconfig, tmp_path / "operator.log", args=args)


@pytest.fixture
def operator(cluster: Any, api: Any, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = operator_for(cluster, api, namespace, tmp_path).start()
    yield op
    op.stop()


def deployments(api: Any, namespace: str, name: str) -> list[Any]:
    return list(
        client.AppsV1Api(api)
        .list_namespaced_deployment(namespace, label_selector=f"{LABEL}={name}")
        .items
    )


def replica_sets(api: Any, namespace: str, name: str) -> list[Any]:
    return list(
        client.AppsV1Api(api)
        .list_namespaced_replica_set(namespace, label_selector=f"{LABEL}={name}")
        .items
    )


def serving_pods(api: Any, namespace: str, name: str) -> list[Any]:
    sel = f"{LABEL}={name},app.kubernetes.io/component=serving"
    return [
        p
        for p in client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=sel).items
        if not p.metadata.deletion_timestamp
    ]


def ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def history(obj: dict[str, Any], event: str) -> list[dict[str, Any]]:
    return [h for h in (obj.get("status") or {}).get("history", []) if h["event"] == event]


def children_are_single(api: Any, namespace: str, name: str) -> None:
    """Exactly one of everything: no reconcile, replayed after a fault, made a second copy."""
    assert len(jobs(api, namespace, name)) == 1, [
        j.metadata.name for j in jobs(api, namespace, name)
    ]
    assert len(deployments(api, namespace, name)) == 1
    # One ReplicaSet: the pod template was never rewritten (no spurious second rollout).
    assert len(replica_sets(api, namespace, name)) == 1
    services = client.CoreV1Api(api).list_namespaced_service(
        namespace, label_selector=f"{LABEL}={name}"
    )
    assert len(services.items) == 1


def test_operator_sigkilled_mid_tuning_and_mid_rollout_converges_without_duplicates(
    cluster: Any, api: Any, namespace: str, tmp_path: Path, gate: Path
) -> None:
    op = operator_for(cluster, api, namespace, tmp_path).start()
    try:
        apply(cluster, namespace, demo("sigkill", hardware=HARDWARE), tmp_path)
        job = wait_for(lambda: jobs(api, namespace, "sigkill"), "tuning Job", timeout=60)[0]
        core = client.CoreV1Api(api)
        wait_for(
            lambda: [p for p in core.list_namespaced_pod(namespace, label_selector=f"job-name={job.metadata.name}").items
                     if p.status.phase == "Running"],
            "tuning pod running (held at the gate)",
        )  # fmt: skip
        assert condition(isvc(api, namespace, "sigkill"), "Tuned")["reason"] == "Tuning"

        # 1. Mid-tuning: the restarted operator resumes the object and adopts the running Job.
        kill_operator(op)
        op.start()
        wait_for(lambda: op.metric("infertune_operator_reconciles_total", trigger="resume") >= 1 or None,
                 "the restarted operator resumed the object", timeout=60)  # fmt: skip
        time.sleep(2)
        assert [j.metadata.name for j in jobs(api, namespace, "sigkill")] == [job.metadata.name]
        assert isvc(api, namespace, "sigkill")["status"]["tuning"]["job"] == job.metadata.name

        # 2. Mid-rollout: killed as soon as the Deployment exists, before it is available.
        release(gate)
        wait_for(lambda: deployments(api, namespace, "sigkill"), "Deployment created", timeout=120)
        kill_operator(op)
        dep = deployments(api, namespace, "sigkill")[0]
        assert not (dep.status.available_replicas or 0), "killed too late: already available"
        time.sleep(1)
        op.start()

        obj = wait_phase(api, namespace, "sigkill", ("Serving",), op, timeout=240)
        for kind in ("Tuned", "RolledOut", "Ready"):
            assert condition(obj, kind)["status"] == "True", condition(obj, kind)
        assert obj["status"]["tuning"]["job"] == job.metadata.name
        assert obj["status"]["tuning"]["finishedAt"]
        time.sleep(3)  # anything a replayed event would still do, it has done by now
        children_are_single(api, namespace, "sigkill")
        obj = isvc(api, namespace, "sigkill")
        assert len(history(obj, "TuningStarted")) == 1, obj["status"]["history"]
        assert len(history(obj, "Tuned")) == 1, obj["status"]["history"]  # ingested once
        assert len(history(obj, "RolledOut")) == 1, obj["status"]["history"]
    finally:
        op.stop()


def test_api_server_restarted_under_the_operator_watches_resume_without_duplicate_work(
    cluster: Any, api: Any, namespace: str, tmp_path: Path, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, demo("before", hardware=HARDWARE), tmp_path)
    wait_for(lambda: condition(isvc(api, namespace, "before"), "Tuned").get("status") == "True",
             "first object tuned", timeout=120)  # fmt: skip
    first_job = jobs(api, namespace, "before")[0].metadata.name

    cluster.stop_apiserver()  # a crash: every watch and keep-alive connection breaks at once
    time.sleep(5)
    assert operator.proc is not None and operator.proc.poll() is None
    cluster.start_apiserver()

    # Just after it is back: a new object and a tuning-relevant change to the old one.
    apply(cluster, namespace, demo("after", hardware=HARDWARE), tmp_path)
    cluster.kubectl("patch", "itsvc", "before", "-n", namespace, "--type=merge",
                    "-p", '{"spec":{"slo":{"ttft":{"max":"450ms"}}}}')  # fmt: skip

    def retuned() -> dict[str, Any] | None:
        o = isvc(api, namespace, "before")
        run = o["status"].get("tuning") or {}
        done = run.get("job") != first_job and run.get("finishedAt")
        return o if done and condition(o, "Tuned").get("status") == "True" else None

    with explained(operator, api, namespace):
        wait_for(retuned, "the spec change made after the restart is tuned", timeout=180, every=1.0)
        wait_for(lambda: condition(isvc(api, namespace, "after"), "Tuned").get("status") == "True",
                 "the object created after the restart is tuned", timeout=180, every=1.0)  # fmt: skip
    time.sleep(3)
    # The superseded run's Job is deleted; one run per decision, none repeated after the restart.
    before = jobs(api, namespace, "before")
    assert [j.metadata.labels["infertune.dev/run-reason"] for j in before] == ["SpecChanged"]
    started = [h["reason"] for h in history(isvc(api, namespace, "before"), "TuningStarted")]
    assert started == ["Created", "SpecChanged"], started
    assert len(history(isvc(api, namespace, "after"), "TuningStarted")) == 1
    assert len(jobs(api, namespace, "after")) == 1
    for name in ("before", "after"):
        assert len(deployments(api, namespace, name)) <= 1
    assert operator.proc is not None and operator.proc.poll() is None  # it rode it out


def test_conflicts_and_throttling_are_retried_with_backoff(
    cluster: Any, api: Any, namespace: str, tmp_path: Path, gate: Path
) -> None:
    name = "contended"
    objects = client.CustomObjectsApi(api)

    def concurrent_write() -> None:
        # Another writer changes the object between the operator's read and its status write.
        objects.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name,
            {"metadata": {"annotations": {"test.infertune.dev/touched": str(time.time())}}},
        )  # fmt: skip

    status = rf"/namespaces/{namespace}/{PLURAL}/{name}/status$"
    faults = [
        Fault("POST", rf"/namespaces/{namespace}/jobs$", 429, times=2, retry_after="2"),
        Fault("PATCH", status, 409, times=1, conflict=concurrent_write),
    ]
    proxy = FaultProxy(cluster.server, cluster.ca_cert, faults).start()
    op = operator_for(cluster, api, namespace, tmp_path, server=proxy.url).start()
    try:
        apply(cluster, namespace, demo(name, hardware=HARDWARE), tmp_path)
        wait_for(lambda: jobs(api, namespace, name), "tuning Job despite two 429s", timeout=90)
        wait_for(
            lambda: faults[1].upstream or None, "the first status write conflicted", timeout=60
        )
        assert faults[1].upstream == [409]  # the API server itself refused the stale write
        wait_for(lambda: (isvc(api, namespace, name).get("status") or {}).get("tuning"),
                 "status written after the conflict", timeout=60)  # fmt: skip

        # While the result is ingested (a Job event, not a create/update handler): the read of
        # the object is throttled and its status write conflicts.
        late = [
            Fault(
                "GET", rf"/namespaces/{namespace}/{PLURAL}/{name}$", 429, times=1, retry_after="1"
            ),
            Fault("PATCH", status, 409, times=1, conflict=concurrent_write),
        ]
        proxy.faults.extend(late)
        release(gate)
        try:
            obj = wait_phase(api, namespace, name, ("Serving",), op, timeout=240)
        except AssertionError as exc:
            pods = client.CoreV1Api(api).list_namespaced_pod(namespace).items
            raise AssertionError(
                f"{exc}\njobs: {[(j.metadata.name, j.status.conditions) for j in jobs(api, namespace, name)]}"
                f"\npods: {[(p.metadata.name, p.spec.node_name, p.status.phase) for p in pods]}"
                f"\nfaults: {[(f.method, f.path, len(f.injected), f.upstream) for f in proxy.faults]}"
            ) from None
        assert condition(obj, "Tuned")["status"] == "True"
        assert [len(f.injected) for f in proxy.faults] == [2, 1, 1, 1]  # every fault happened
        assert late[1].upstream == [409]

        # Backoff: after the last 429 the create came back no sooner than Retry-After said (more
        # than one handler may try the create; none may hammer the API server meanwhile).
        posts = [
            t
            for t, m, p in proxy.requests
            if m == "POST" and p.endswith(f"/namespaces/{namespace}/jobs")
        ]
        throttled = faults[0].injected
        after = [t for t in posts if t > throttled[-1] + 0.01]
        assert after and after[0] - throttled[-1] >= 2.0 - 0.1, (throttled, posts)
        assert len(jobs(api, namespace, name)) == 1
        log = op.log()
        assert "throttled" in log and "conflict" in log, log[-3000:]
        assert op.proc is not None and op.proc.poll() is None
    finally:
        op.stop()
        proxy.stop()


@contextlib.contextmanager
def held_status_writes(
    cluster: Any, api: Any, namespace: str, tmp_path: Path, name: str, body: str | None = None
) -> Iterator[tuple[OperatorProcess, Fault]]:
    """An operator behind a fault proxy that throttles (429) every status write of `name`, or
    only those whose body matches `body`, until the test lets them through."""
    status = rf"/namespaces/{namespace}/{PLURAL}/{name}/status$"
    held = Fault("PATCH", status, 429, times=10_000, retry_after="2", body=body)
    proxy = FaultProxy(cluster.server, cluster.ca_cert, [held]).start()
    op = operator_for(cluster, api, namespace, tmp_path, server=proxy.url).start()
    try:
        yield op, held
    finally:
        op.stop()
        proxy.stop()


def let_through_then_converge(
    op: OperatorProcess,
    api: Any,
    namespace: str,
    name: str,
    held: Fault,
    condition_type: str,
    timeout: float,
) -> dict[str, Any]:
    """Let the held status writes through and wait for `condition_type` to become True. The
    child settled while they were held and sends no more events, so only the timer's read-back
    can get it there."""
    assert held.injected  # the operator did try to write the status
    held.times = len(held.injected)
    with explained(op, api, namespace):
        wait_for(
            lambda: condition(isvc(api, namespace, name), condition_type).get("status") == "True",
            f"{condition_type}=True without a further event from the settled child",
            timeout=timeout,
            every=1.0,
        )
    return isvc(api, namespace, name)


def test_a_job_that_finishes_before_its_run_is_recorded_is_still_ingested(
    cluster: Any, api: Any, namespace: str, tmp_path: Path
) -> None:
    """The Job event can come too early to count: every status write is throttled until the
    (ungated, fast) tuning Job has finished, so the operator sees the Job complete while its
    status does not yet name the run, and a finished Job sends no further events. The CI
    failure of stop 14/15 was this race after an API server restart. The keep-checking timer
    reads a pending run's Job back and ingests it."""
    name = "early"
    with held_status_writes(cluster, api, namespace, tmp_path, name) as (op, held):
        apply(cluster, namespace, demo(name, hardware=HARDWARE), tmp_path)

        def finished() -> bool:
            return any(
                c.type == "Complete" and c.status == "True"
                for j in jobs(api, namespace, name)
                for c in j.status.conditions or []
            )

        wait_for(finished, "the tuning Job completed", timeout=120, every=0.5)
        assert not (isvc(api, namespace, name).get("status") or {}).get("tuning")
        obj = let_through_then_converge(op, api, namespace, name, held, "Tuned", timeout=90)
        assert obj["status"]["tuning"]["finishedAt"]
        assert obj["status"]["tuning"]["job"] == jobs(api, namespace, name)[0].metadata.name
        assert len(jobs(api, namespace, name)) == 1
        assert "finished without its result ingested" in op.log()


def test_a_deployment_that_settles_before_its_rollout_is_recorded_is_still_seen(
    cluster: Any, api: Any, namespace: str, tmp_path: Path
) -> None:
    """The Deployment's counterpart of the test above: every status write that records the
    live config is throttled until the serving Deployment is available, so its events all come
    while the status does not name the config (and are ignored), and a settled Deployment sends
    no more. The timer reads an unsettled rollout's Deployment back and records it."""
    name = "settled"
    with held_status_writes(cluster, api, namespace, tmp_path, name, body='"live"') as (op, held):
        apply(cluster, namespace, demo(name, hardware=HARDWARE), tmp_path)

        def available() -> bool:
            return any(
                (d.status.available_replicas or 0) >= 1 for d in deployments(api, namespace, name)
            )

        wait_for(available, "the serving Deployment available", timeout=180, every=0.5)
        assert not (isvc(api, namespace, name).get("status") or {}).get("live")
        obj = let_through_then_converge(op, api, namespace, name, held, "RolledOut", timeout=150)
        assert condition(obj, "Tuned")["status"] == "True"
        assert condition(obj, "Ready")["status"] == "True"
        assert len(deployments(api, namespace, name)) == 1
        assert "settled without its state recorded" in op.log()


def test_a_tuning_job_deleted_mid_run_is_reported_not_left_tuning(
    cluster: Any, api: Any, namespace: str, gate: Path, operator: OperatorProcess
) -> None:
    """An SRE deletes a running tuning Job (to stop it, or by a cleanup script): the object
    says so (Tuned=False, TuningJobLost, a Warning event) instead of showing Tuning for ever."""
    name = "orphan"
    apply(cluster, namespace, demo(name, hardware=HARDWARE), gate.parent)
    job = wait_for(lambda: jobs(api, namespace, name), "tuning Job", timeout=60)[0]
    client.BatchV1Api(api).delete_namespaced_job(
        job.metadata.name, namespace, propagation_policy="Background"
    )

    def lost() -> dict[str, Any] | None:
        o = isvc(api, namespace, name)
        return o if condition(o, "Tuned").get("reason") == "TuningJobLost" else None

    with explained(operator, api, namespace):
        obj = wait_for(lost, "the lost Job reported", timeout=90, every=1.0)
    tuned = condition(obj, "Tuned")
    assert tuned["status"] == "False"
    assert f"tuning Job {job.metadata.name} was deleted before it finished" in tuned["message"]
    assert obj["status"]["tuning"]["finishedAt"]
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    assert any(e.reason == "TuningJobLost" and e.type == "Warning" for e in events.items)
    assert not jobs(api, namespace, name)  # nothing recreated it behind the user's back
    release(gate)


# The stall test's load: CLIENTS requests sent together every WAVE_S seconds. Only requests the
# engine has already read when it freezes carry the stall in its histograms (it times a request
# from when it reads it, as vLLM does; one sent during the stall waits in the kernel's socket
# queue and is timed from the thaw), so the stall's share of a check window is the number caught
# inside over the number answered in that window. With clients back to back that share is
# (time a request spends inside) / (window), Little's law: 98 ms / ~10 s on a quiet machine, 1%,
# which no p95 can show, and pacing the clients does not change the ratio. Waves fix both sides:
# the freeze catches a whole wave inside the engine, and a window of up to 20 s (one whose scrape
# fell in the stall and timed out spans two checks) answers at most 7 other waves: 4 of <= 32
# requests, 12% or more, on a fast engine or a slow one alike.
CLIENTS = 4
WAVE_S = 3.0
E2E_BOUND_S = 5.0  # a bucket bound of the engine's e2e histogram: p95 is over it iff > 5% are


def _one_request(url: str, body: bytes, sent: list[int], errors: list[str]) -> None:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
        sent.append(1)
    except Exception as exc:
        errors.append(repr(exc)[:200])


def _waves(
    url: str, stop: threading.Event, sent: list[int], errors: list[str], fired: threading.Event
) -> None:
    """Every WAVE_S seconds CLIENTS requests at once (`fired` set when sent); the next wave waits
    for this one's answers, so a slow engine gets fewer waves, never a growing queue."""
    body = json.dumps({"model": "tiny-llama", "prompt": "hello " * 40, "max_tokens": 16}).encode()
    while not stop.is_set():
        began = time.monotonic()
        wave = [threading.Thread(target=_one_request, args=(url, body, sent, errors), daemon=True)
                for _ in range(CLIENTS)]  # fmt: skip
        for t in wave:
            t.start()
        fired.set()
        for t in wave:
            t.join()
        stop.wait(max(0.0, WAVE_S - (time.monotonic() - began)))


def _engine_figures(metrics_url: str) -> tuple[float, float]:
    """(requests the engine holds, requests whose e2e exceeded E2E_BOUND_S) from /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    e2e = parse_exposition(text)[E2E]
    held = sum(
        s.value
        for f in text_string_to_metric_families(text)
        if f.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
        for s in f.samples
    )
    return held, e2e.count - e2e.buckets.get(E2E_BOUND_S, 0.0)


@pytest.mark.slow
def test_a_serving_pod_that_stalls_crashes_or_is_deleted_is_replaced_without_a_retune(
    cluster: Any, api: Any, agent: Any, namespace: str, tmp_path: Path, operator: OperatorProcess
) -> None:
    name = "bumpy"
    doc = demo(
        name,
        hardware=HARDWARE,
        # Loose bounds a healthy tiny engine meets even on a busy machine (TTFT p95 reached 3 s
        # here with other engines on the two cores); a 6 s stall does not. The requests it
        # catches are decoding (their first token is out), so the e2e bound is the one it breaks.
        slo={"ttft": {"max": "5s", "percentile": "p95"}, "itl": {"max": "1s", "percentile": "p95"},
             "e2e": {"max": f"{E2E_BOUND_S:g}s", "percentile": "p95"}},
        retune={"checkInterval": "8s", "violationWindow": "60s", "cooldown": "1m", "triggers": ["SLOViolation"]},
    )  # fmt: skip
    apply(cluster, namespace, doc, tmp_path)
    wait_phase(api, namespace, name, ("Serving",), operator, timeout=240)
    pod = wait_for(
        lambda: [p for p in serving_pods(api, namespace, name) if ready(p)], "ready pod"
    )[0]
    url = f"http://{pod.status.pod_ip}:8000/v1/completions"
    metrics_url = f"http://{pod.status.pod_ip}:8000/metrics"
    stop, fired, sent, errors = threading.Event(), threading.Event(), [], []
    threading.Thread(target=_waves, args=(url, stop, sent, errors, fired), daemon=True).start()
    seen: list[str] = []  # SLOMet verdicts (True/False, not NoTraffic) in the order they changed

    def slo_met() -> str | None:
        status = condition(isvc(api, namespace, name), "SLOMet").get("status")
        if status in ("True", "False") and (not seen or seen[-1] != status):
            seen.append(status)
        return status

    def until(verdict: str, what: str) -> None:
        try:
            wait_for(lambda: slo_met() == verdict or None, what, timeout=60, every=0.5)
        except AssertionError as exc:
            st = isvc(api, namespace, name).get("status") or {}
            raise AssertionError(
                f"{exc}; verdicts {seen}; SLOMet {condition(isvc(api, namespace, name), 'SLOMet')}; "
                f"observed {st.get('observed')}; sent {sum(sent)}, errors {errors[-3:]}\n"
                f"{operator.log()[-2000:]}"
            ) from None

    try:
        until("True", "SLO met under light load")
        # One bad window: the engine freezes for 6 s (a stalled node) with a wave inside it
        # (held by the engine, not only sent), then it recovers.
        pid = pod_pid(agent, namespace, pod.metadata.name)
        assert pid is not None
        _, over_before = _engine_figures(metrics_url)
        fired.clear()
        assert fired.wait(30), "no wave sent"
        # Polled across waves: on a fast engine a wave is inside for ~0.1 s, and one may be missed.
        inside = lambda: _engine_figures(metrics_url)[0] >= CLIENTS or None  # noqa: E731
        wait_for(inside, "a wave inside the engine", timeout=30, every=0.01)
        os.killpg(pid, signal.SIGSTOP)
        time.sleep(6)
        os.killpg(pid, signal.SIGCONT)
        # The fault as meant: every request of the wave waited out the stall (the engine's own
        # histogram says so, once the next wave shows this one answered).
        fired.clear()
        assert fired.wait(60), "the frozen wave was never answered"
        caught = _engine_figures(metrics_url)[1] - over_before
        assert caught >= CLIENTS, f"the stall caught {caught:g} of the wave's {CLIENTS} requests"
        until("False", "the bad window is seen")
        until("True", "the next window is good again")
    finally:
        stop.set()
    assert sum(sent) >= 10, errors[-3:]

    # The engine process crashes: the container is restarted in place.
    pid = pod_pid(agent, namespace, pod.metadata.name)
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    core = client.CoreV1Api(api)

    def restarted() -> Any:
        p = core.read_namespaced_pod(pod.metadata.name, namespace)
        cs = (p.status.container_statuses or [None])[0]
        return p if cs is not None and cs.restart_count >= 1 and ready(p) else None

    wait_for(restarted, "crashed container restarted and ready", timeout=120)

    # The pod is deleted (node drained, evicted): the Deployment's ReplicaSet replaces it.
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    replacement = wait_for(
        lambda: [p for p in serving_pods(api, namespace, name) if p.metadata.name != pod.metadata.name and ready(p)],
        "replacement pod ready", timeout=120,
    )[0]  # fmt: skip
    assert replacement.metadata.owner_references[0].kind == "ReplicaSet"

    def rolled_out() -> dict[str, Any] | None:
        o = isvc(api, namespace, name)
        return o if condition(o, "RolledOut").get("status") == "True" else None

    obj = wait_for(rolled_out, "RolledOut again", timeout=60)
    assert seen[:3] == ["True", "False", "True"], seen
    assert not history(obj, "RetuneTriggered"), obj["status"]["history"]
    assert len(jobs(api, namespace, name)) == 1
    assert operator.metric("infertune_operator_retunes_total") == 0
