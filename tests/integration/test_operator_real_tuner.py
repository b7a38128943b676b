"""The demo end to end with the real tuner (`infertune tune`) in the Job and the real engine
serving: slow (real studies on the CPU), so it is not part of the default run.

The stand-in flows (test_operator_flow.py) prove the operator's rules with a placeholder tuner; here
the same path runs with the real study, profile and summary: apply -> Job on the fake GPU node ->
real tune -> rollout of the real winner; then real traffic with longer prompts -> TrafficDrift ->
a second real tune on the observed traffic -> the winner replaces the live config only if it beats
it (RetuneAccepted with a rollout, or RetuneKept with the Deployment untouched)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from operator_harness import REAL_CLI, OperatorProcess, operator_kubeconfig, wait_for
from test_operator_flow import (
    DEMO,
    LABEL,
    _drive,
    apply,
    condition,
    demo,
    deployment,
    isvc,
    jobs,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(2400)]


@pytest.fixture
def real_operator(cluster: Any, api: Any, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The operator whose pods run this venv's real `infertune` console script."""
    kubeconfig = operator_kubeconfig(cluster, api, tmp_path)
    op = OperatorProcess(kubeconfig, tmp_path / "op.log", command=REAL_CLI).start()
    yield op
    op.stop()
    assert not op.rbac_denials(), op.log()[-3000:]


def _story(obj: dict[str, Any]) -> str:
    st = obj.get("status") or {}
    lines = [f"phase={st.get('phase')}"]
    lines += [
        f"  {c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')[:160]}"
        for c in st.get("conditions", [])
    ]
    lines += [
        f"  history {h['event']} ({h.get('reason')}): {h.get('message', '')[:160]}"
        for h in st.get("history", [])
    ]
    return "\n".join(lines)


def _command_flag(dep: Any, flag: str) -> str:
    argv = list(dep.spec.template.spec.containers[0].command)
    return str(argv[argv.index(flag) + 1])


def test_demo_with_the_real_tuner(
    cluster: Any, api: Any, namespace: str, real_operator: OperatorProcess
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", str(DEMO))
    job = wait_for(lambda: jobs(api, namespace, "tiny-demo"), "tuning Job", timeout=30)[0]
    obj = wait_phase(
        api,
        namespace,
        "tiny-demo",
        ("Serving", "Degraded", "Failed"),
        real_operator,
        timeout=1500,
    )
    print("\n" + _story(obj))
    st = obj["status"]
    tuned = condition(obj, "Tuned")
    assert st["phase"] != "Failed", _story(obj) + "\n" + real_operator.log()[-3000:]
    assert (tuned["status"], tuned["reason"]) in (("True", "Tuned"), ("False", "SLOInfeasible"))
    assert st["tuning"]["trialsCompleted"] >= 1
    assert st["tuning"]["gpuProduct"] == "NVIDIA-H100-80GB-HBM3"  # the fake GPU node it ran on
    assert st["profile"]["hardware"]
    assert condition(obj, "Profiled")["status"] == "True"
    assert condition(obj, "RolledOut")["status"] == "True"
    # The pod ran the real tuner: its summary names a winner from the demo's search space.
    live, space = st["live"], yaml.safe_load(DEMO.read_text())["spec"]["search"]
    assert live["engine"] in space["engines"]
    assert live["quantization"] in space["quantizations"]
    assert live["maxNumSeqs"] in space["maxNumSeqs"]["values"]
    assert live["maxNumBatchedTokens"] in space["maxNumBatchedTokens"]["values"]
    assert live["measured"]["ttftP95Ms"] > 0
    pod = (
        client.CoreV1Api(api)
        .list_namespaced_pod(namespace, label_selector=f"job-name={job.metadata.name}")
        .items[0]
    )
    assert pod.spec.node_name == "gpu-h100-0"

    # The Deployment serves exactly that winner.
    dep = deployment(api, namespace, "tiny-demo")
    assert dep.spec.template.metadata.annotations["infertune.dev/config-hash"] == live["configHash"]
    assert _command_flag(dep, "--quantization") == live["quantization"]
    assert _command_flag(dep, "--max-num-seqs") == str(live["maxNumSeqs"])

    table = cluster.kubectl("get", "itsvc", "-n", namespace, "-o", "wide").stdout
    print(table)
    row = table.splitlines()[1].split()
    assert row[:5] == ["tiny-demo", st["phase"], "True", "builtin", live["quantization"]], table
    events = cluster.kubectl("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=tiny-demo",
                             "-o", "jsonpath={.items[*].reason}").stdout.split()  # fmt: skip
    assert {"TuningStarted", "RollingOut", "RolledOut"} <= set(events), events
    assert {"Tuned", "SLOInfeasible"} & set(events), events


def test_real_traffic_drift_retunes_with_the_real_tuner_and_rolls_out_only_a_better_winner(
    cluster: Any, api: Any, namespace: str, real_operator: OperatorProcess, tmp_path: Path
) -> None:
    # A small study (two cheap knobs, three trials) so two real runs fit a test.
    doc = demo(
        "real-drift",
        traffic={
            "arrival": "poisson", "rate": 4,
            "promptTokens": {"distribution": "uniform", "min": 32, "max": 96},
            "outputTokens": {"distribution": "fixed", "mean": 8},
            "numRequests": 16, "warmupRequests": 2,
        },
        search={"engines": ["builtin"], "quantizations": ["fp32", "int8"],
                "maxNumSeqs": {"values": [4, 16]}, "maxNumBatchedTokens": {"values": [512]},
                "kvBlockSizes": [16], "cudaGraph": [False], "seed": 1},
        budget={"maxTrials": 3, "maxDuration": "5m", "trialTimeout": "2m"},
        hardware={"gpuProducts": ["NVIDIA-A100-SXM4-80GB"], "gpusPerReplica": 0,
                  "cpu": "1", "memory": "2Gi"},
        # The first run starts the cooldown too: 1m has passed by the time it serves.
        retune={"checkInterval": "10s", "violationWindow": "20s", "cooldown": "1m",
                "triggers": ["TrafficDrift"]},
    )  # fmt: skip
    apply(cluster, namespace, doc, tmp_path)
    obj = wait_phase(
        api, namespace, "real-drift", ("Serving", "Degraded", "Failed"), real_operator, timeout=900
    )
    print("\n" + _story(obj))
    assert obj["status"]["phase"] != "Failed", _story(obj)
    first = obj["status"]["live"]
    tuned_prompt = first["measured"].get("promptTokensMean") or 64

    pod = (
        client.CoreV1Api(api)
        .list_namespaced_pod(
            namespace, label_selector=f"{LABEL}=real-drift,app.kubernetes.io/component=serving"
        )
        .items[0]
    )
    url = f"http://{pod.status.pod_ip}:8000/v1/completions"
    prompt = " ".join(f"word{i % 50}" for i in range(120))  # far longer than the tuned prompts
    stop, sent, errors = threading.Event(), [], []  # type: ignore[var-annotated]
    drivers = [
        threading.Thread(target=_drive, args=(url, prompt, stop, sent, errors), daemon=True)
        for _ in range(2)
    ]
    for t in drivers:
        t.start()
    try:
        retune = wait_for(
            lambda: [j for j in jobs(api, namespace, "real-drift")
                     if j.metadata.labels["infertune.dev/run-reason"] == "TrafficDrift"],
            "TrafficDrift retune Job", timeout=300, every=1.0,
        )[0]  # fmt: skip
    except AssertionError as exc:
        status = json.dumps(isvc(api, namespace, "real-drift")["status"].get("observed"), indent=1)
        raise AssertionError(
            f"{exc}; {sum(sent)} requests, errors {errors[-3:]}\n{status}\n{real_operator.log()[-2000:]}"
        ) from None
    finally:
        stop.set()
    observed = isvc(api, namespace, "real-drift")["status"]["observed"]
    assert observed["figures"]["promptTokensMean"] > 2 * tuned_prompt
    cm = client.CoreV1Api(api).read_namespaced_config_map(retune.metadata.name, namespace)
    assert (
        yaml.safe_load(cm.data["spec.yaml"])["traffic"]["promptTokens"]["mean"] > 2 * tuned_prompt
    )

    def judged() -> dict[str, Any] | None:
        o = isvc(api, namespace, "real-drift")
        events = {h["event"] for h in o["status"].get("history", [])}
        done = events & {"RetuneAccepted", "RetuneKept"}
        failed = condition(o, "Tuned").get("reason") in ("TuningFailed", "NoConfiguration")
        return o if done or failed else None

    obj = wait_for(judged, "retune result judged", timeout=900, every=2.0)
    print(_story(obj))
    st = obj["status"]
    assert condition(obj, "Tuned")["reason"] in ("Tuned", "SLOInfeasible"), _story(obj)
    verdict = [h for h in st["history"] if h["event"] in ("RetuneAccepted", "RetuneKept")][-1]
    assert verdict["reason"] == "TrafficDrift"

    def template_hash() -> str:
        dep = deployment(api, namespace, "real-drift")
        return str(dep.spec.template.metadata.annotations["infertune.dev/config-hash"])

    if verdict["event"] == "RetuneAccepted":
        # The new winner beat the live config on the drifted traffic: it is what serves now.
        assert st["live"]["configHash"] == st["best"]["configHash"] != first["configHash"]
        wait_for(lambda: template_hash() == st["live"]["configHash"], "new config rolled out")
    else:
        # It did not: the live config and its pods stay as they were.
        assert st["live"]["configHash"] == first["configHash"]
        assert template_hash() == first["configHash"]
    print(f"verdict: {verdict['event']}: {verdict['message']}")
