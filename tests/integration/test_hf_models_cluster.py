"""hf:// models through the operator on a real API server, the Hub being a local server in its URL
layout (infertune.testing.hub_server) that the real huggingface_hub client talks to.

A manifest naming hf://org/tiny (the project's tiny random checkpoint, served as a Hub repository)
is fetched by the tuning pod's init step into the namespace's model cache claim, the tuning pod
finds it there, and the Deployment's engine serves it from the same directory (its own init step
finds the finished fetch and downloads nothing). A missing repository, a missing revision, a gated
repository without a token and with a refused one each end with ModelFetched=False naming the field
and the Hub's answer, an Event, and no pod retried."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import OperatorProcess, operator_kubeconfig, wait_for
from test_operator_flow import apply, condition, demo, deployment, isvc, jobs, wait_phase

from infertune.testing.hub_server import HubServer

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(400)]
TOKEN = "hf_cluster_test_token_1234"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    from infertune.engine.make_model import ensure_model

    root = tmp_path_factory.mktemp("hub")
    for repo in ("org/tiny", "org/gated"):
        shutil.copytree(ensure_model("tiny"), root / repo)
    with HubServer(root, tokens={TOKEN, "hf_not_granted"}, gated={"org/gated": {TOKEN}}) as server:
        yield server


@pytest.fixture(scope="module")
def hf_operator(
    cluster: Any, api: Any, hub: HubServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    work = tmp_path_factory.mktemp("hf-operator")
    args = ("--all-namespaces", "--hf-endpoint", hub.endpoint)
    op = OperatorProcess(operator_kubeconfig(cluster, api, work), work / "op.log", args).start()
    yield op
    op.stop()
    assert not op.rbac_denials(), op.rbac_denials()[-5:]


def hf_demo(name: str, **model: Any) -> dict[str, Any]:
    return demo(name, model={"name": "tiny-llama", **model})


def _downloads(hub: HubServer, repo: str) -> list[str]:
    return [p for m, p, _ in hub.state.requests if m == "GET" and f"/{repo}/resolve/" in p]


def test_an_hf_model_is_fetched_once_tuned_and_served_from_the_cache(
    cluster: Any,
    api: Any,
    agent: Any,
    namespace: str,
    hub: HubServer,
    hf_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    doc = hf_demo("hf-tiny", uri="hf://org/tiny", cache={"claimName": "model-cache"})
    apply(cluster, namespace, doc, tmp_path)
    obj = wait_phase(api, namespace, "hf-tiny", ("Serving", "Degraded"), hf_operator, timeout=300)
    assert condition(obj, "ModelFetched")["status"] == "True", condition(obj, "ModelFetched")
    dep = deployment(api, namespace, "hf-tiny")
    pod = dep.spec.template.spec
    argv = list(pod.containers[0].command)
    # The engine got the cache's directory, never the hf:// string.
    assert argv[argv.index("--model") + 1] == "/mnt/model-cache/hf/org/tiny/main"
    assert not any(a.startswith("hf://") for a in argv)
    assert [c.name for c in pod.init_containers] == ["fetch-model"]
    # One download per file for the namespace: the tuning pod's init step fetched, the serving
    # pod's found the finished fetch in the claim (and the tuner found it where it looks).
    files = sorted(
        p.name
        for p in (
            agent.state_dir / "pvcs" / namespace / "model-cache" / "hf/org/tiny/main"
        ).iterdir()
    )
    assert "config.json" in files and ".infertune-fetched.json" in files
    fetched = _downloads(hub, "org/tiny")
    assert len(fetched) == len(set(fetched)) == len([f for f in files if not f.startswith(".")])
    # The fetch step's report reached the status: it sizes an emptyDir cache for serving pods.
    served = agent.state_dir / "pvcs" / namespace / "model-cache" / "hf/org/tiny/main"
    weights = sum(p.stat().st_size for p in served.iterdir() if not p.name.startswith("."))
    assert obj["status"]["live"]["modelBytes"] == weights
    # The serving pod's init step ran (and found the files) before the engine started.
    pods = (
        client.CoreV1Api(api)
        .list_namespaced_pod(namespace, label_selector="infertune.dev/track=stable")
        .items
    )
    assert pods and all(
        s.state.terminated and s.state.terminated.exit_code == 0
        for p in pods
        for s in p.status.init_container_statuses or []
    )


def _secret(api: Any, namespace: str, name: str, token: str) -> None:
    client.CoreV1Api(api).create_namespaced_secret(
        namespace, {"metadata": {"name": name}, "stringData": {"token": token}}
    )


CASES: list[tuple[str, dict[str, Any], str, str, str]] = [
    ("hf-missing", {"uri": "hf://org/missing"}, "ModelNotFound", "spec.model.uri", "404"),
    ("hf-badrev", {"uri": "hf://org/tiny", "revision": "nope"}, "RevisionNotFound", "spec.model.revision", "404"),
    ("hf-notoken", {"uri": "hf://org/gated"}, "ModelAccessDenied", "spec.model.tokenSecret", "401"),
    ("hf-refused", {"uri": "hf://org/gated", "tokenSecret": {"name": "weak"}}, "ModelAccessDenied", "spec.model.tokenSecret (Secret 'weak'", "403"),
]  # fmt: skip


def test_bad_repo_revision_and_token_end_with_the_field_and_the_hubs_answer(
    cluster: Any,
    api: Any,
    namespace: str,
    hub: HubServer,
    hf_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    _secret(api, namespace, "weak", "hf_not_granted")
    for name, model, _, _, _ in CASES:
        apply(cluster, namespace, hf_demo(name, **model), tmp_path)
    core = client.CoreV1Api(api)
    for name, _, reason, field, status in CASES:
        obj = wait_phase(api, namespace, name, ("Failed",), hf_operator, timeout=180)
        fetched = condition(obj, "ModelFetched")
        assert fetched["status"] == "False" and fetched["reason"] == reason, fetched
        assert fetched["message"].startswith(field), fetched
        assert f"the Hub answered {status}" in fetched["message"], fetched
        assert TOKEN not in fetched["message"] and "hf_not_granted" not in fetched["message"]
        assert condition(obj, "Tuned")["reason"] == "ModelFetchFailed"
        events = wait_for(
            lambda n=name, r=reason: [
                e
                for e in core.list_namespaced_event(namespace).items
                if e.involved_object.name == n and e.reason == r
            ],
            f"{name} event {reason}",
            timeout=30,
        )
        assert field in events[0].message
    # Nothing retries: the runs are over, their Jobs deleted, and no new pod appears.
    time.sleep(5)
    for name, *_ in CASES:
        assert jobs(api, namespace, name) == [], name
        assert isvc(api, namespace, name)["status"]["tuning"].get("finishedAt")
    pods = core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=tuning")
    assert all(p.metadata.deletion_timestamp or p.status.phase == "Failed" for p in pods.items)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_real_tuner_tunes_an_hf_model_from_the_cache(
    cluster: Any,
    api: Any,
    namespace: str,
    hub: HubServer,
    hf_operator: OperatorProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same path with the real `infertune tune` in the Job (the pods run as this process's
    children, so the switch reaches them): one real trial of the built-in engine on the fetched
    checkpoint, then the Deployment serves it from an emptyDir sized by the fetched bytes."""
    monkeypatch.setenv("INFERTUNE_REAL_TUNER", "1")
    doc = hf_demo("hf-real", uri="hf://org/tiny")
    doc["spec"]["search"] = {
        "engines": ["builtin"], "quantizations": ["fp32"], "maxNumSeqs": {"values": [8]},
        "maxNumBatchedTokens": {"values": [128]}, "kvBlockSizes": [16], "cudaGraph": [False],
    }  # fmt: skip
    doc["spec"]["slo"] = {"ttft": {"max": "5s"}, "itl": {"max": "500ms"}}
    doc["spec"]["traffic"].update(numRequests=12, warmupRequests=2, rate=4)
    doc["spec"]["budget"] = {"maxTrials": 1, "maxDuration": "5m", "trialTimeout": "90s"}
    doc["spec"].pop("quality", None)
    apply(cluster, namespace, doc, tmp_path)
    obj = wait_phase(api, namespace, "hf-real", ("Serving", "Degraded"), hf_operator, timeout=700)
    live = obj["status"]["live"]
    assert live["engine"] == "builtin" and live["quantization"] == "fp32"
    assert obj["status"]["tuning"]["trialsCompleted"] == 1
    pod = deployment(api, namespace, "hf-real").spec.template.spec
    (cache,) = [v for v in pod.volumes if v.name == "model-cache"]
    assert cache.empty_dir.size_limit.endswith("Mi") and live["modelBytes"] > 0
