"""budget.parallelTrials: 2 on the dev cluster (slow): the operator's tuning Job (its own builder,
the storage URL from a Secret, as `--storage-secret` makes it) runs two worker pods on two GPU
nodes, with the real tuner and the real engine, sharing one study in a real PostgreSQL (Debian's
server, services.Postgres). One worker is SIGKILLed mid-trial: no completed trial is lost, its
trial is failed by heartbeat, a replacement pod joins the study, and the study spends its budget.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import node_agent
import optuna
import pytest
import yaml
from fault_helpers import pod_pid
from kubernetes import client
from operator_harness import wait_for
from services import Postgres
from test_faults_tuner import (
    CLI,
    SEARCH,
    SLO,
    TRAFFIC,
    job_done,
    job_pods,
    kill_tree,
)

from infertune.operator.api import InferenceService
from infertune.operator.builders import RunPlan, desired_job, desired_spec_configmap
from infertune.operator.builders.job import pod_tuning_spec
from infertune.operator.hashing import run_hash, tuning_hash
from infertune.operator.pods import pod_summary
from infertune.operator.settings import OperatorSettings
from infertune.operator.tuning_run import _job_pod
from infertune.tuner.study import storage_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PRODUCT = "NVIDIA-L4"
TAINT = {"key": "infertune.dev/parallel-test", "value": "yes", "effect": "NoSchedule"}
BUDGET = 6


def _nodes() -> list[node_agent.FakeNode]:
    """Two GPU nodes of one product, tainted so that only this test's pods land there; two GPUs
    each, so a node could hold both workers: the Job's anti-affinity spreads them."""
    out = []
    for i in range(2):
        n = node_agent.gpu_node(f"gpu-l4-par-{i}", product=PRODUCT, gpus=2, memory_mib=23034)
        n.taints = [TAINT]
        out.append(n)
    return out


def _running(api: Any, agent: Any, namespace: str, job: str) -> dict[str, tuple[str, int]]:
    """Running pods of the Job: name -> (node, main process id)."""
    out = {}
    for p in job_pods(api, namespace, job):
        if p.status.phase == "Running" and p.spec.node_name:
            pid = pod_pid(agent, namespace, p.metadata.name)
            if pid is not None:
                out[p.metadata.name] = (p.spec.node_name, pid)
    return out


def test_two_workers_on_two_gpu_nodes_share_a_postgres_study_and_survive_losing_one(
    cluster: Any, api: Any, agent: Any, namespace: str, tmp_path: Path
) -> None:
    added = _nodes()
    agent.nodes = {**agent.nodes, **{n.name: n for n in added}}
    agent.register()
    pg = Postgres().start()
    core = client.CoreV1Api(api)
    try:
        core.create_namespaced_secret(
            namespace, {"metadata": {"name": "study-storage"}, "stringData": {"url": pg.url}}
        )
        doc = {
            "apiVersion": "infertune.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "parallel"},
            "spec": {
                "model": {"uri": "builtin://tiny", "name": "tiny-llama"},
                "slo": SLO, "traffic": TRAFFIC, "search": SEARCH, "quality": {"enabled": False},
                "budget": {"maxTrials": BUDGET, "parallelTrials": 2, "maxDuration": "30m", "trialTimeout": "2m"},
                "hardware": {"gpuProducts": [PRODUCT], "gpusPerReplica": 1, "cpu": "1", "memory": "2Gi",
                             "tolerations": [{"key": TAINT["key"], "operator": "Equal", "value": "yes", "effect": "NoSchedule"}]},
            },
        }  # fmt: skip
        path = tmp_path / "isvc.yaml"
        path.write_text(yaml.safe_dump(doc))
        cluster.kubectl("apply", "-n", namespace, "-f", str(path))  # the Job's owner
        live = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "infertune.dev", "v1alpha1", namespace, "inferenceservices", "parallel"
        )
        isvc = InferenceService.model_validate({**doc, "metadata": live["metadata"]})
        settings = OperatorSettings(
            storage_secret="study-storage", infertune_command=CLI, job_backoff_limit=2
        )
        tuning = pod_tuning_spec(isvc.spec.tuning_spec())
        plan = RunPlan(run_id="par00001", spec_hash=tuning_hash(isvc.spec),
                       run_hash=run_hash(tuning, None), reason="Created", tuning=tuning)  # fmt: skip
        job_name, study_name = plan.job_name("parallel"), plan.study_name(namespace, "parallel")
        core.create_namespaced_config_map(namespace, desired_spec_configmap(isvc, job_name, tuning))
        client.BatchV1Api(api).create_namespaced_job(namespace, desired_job(isvc, plan, settings))

        # Two workers, on two nodes.
        def two_running() -> dict[str, tuple[str, int]] | None:
            running = _running(api, agent, namespace, job_name)
            return running if len(running) == 2 else None

        workers = wait_for(two_running, "two running worker pods", timeout=180)
        assert {node for node, _ in workers.values()} == {n.name for n in added}, workers

        # Kill one worker while both measure: at least one trial done, two in flight.
        def both_measuring() -> dict[int, Any] | None:
            try:  # the workers create the study once they have profiled
                study = optuna.load_study(study_name=study_name, storage=storage_for(pg.url))
            except KeyError:
                return None
            trials = study.get_trials()
            done = [t for t in trials if t.state.name == "COMPLETE"]
            running = [t for t in trials if t.state.name == "RUNNING"]
            return {t.number: t for t in trials} if done and len(running) == 2 else None

        wait_for(both_measuring, "a trial done and two in flight", timeout=900, every=1.0)
        time.sleep(3)
        victim, (_, pid) = sorted(workers.items())[0]
        kill_tree(pid)
        study = optuna.load_study(study_name=study_name, storage=storage_for(pg.url))
        before = {t.number: t for t in study.get_trials()}
        done_before = {n: t.values for n, t in before.items() if t.state.name == "COMPLETE"}
        running_at_kill = {n for n, t in before.items() if t.state.name == "RUNNING"}

        job = wait_for(
            lambda: job_done(api, namespace, job_name), "Job finished", timeout=1200, every=2.0
        )
        pods = job_pods(api, namespace, job_name)
        logs = {p.metadata.name: agent.pod_log(namespace, p.metadata.name)[-2500:] for p in pods}
        assert job.status.succeeded == 2 and job.status.failed == 1, logs
        assert len(pods) == 3  # the lost worker was replaced and the replacement joined the study

        after = {
            t.number: t
            for t in optuna.load_study(
                study_name=study_name, storage=storage_for(pg.url)
            ).get_trials()
        }
        for number, values in done_before.items():  # nothing measured before the kill was lost
            assert after[number].state.name == "COMPLETE" and after[number].values == values
        stale = [t for t in after.values() if t.user_attrs.get("failed_by_heartbeat")]
        assert len(stale) == 1 and stale[0].number in running_at_kill, logs
        assert (
            stale[0].state.name == "FAIL" and "heartbeat" in stale[0].user_attrs["failure_reason"]
        )
        assert not [t for t in after.values() if t.state.name == "RUNNING"]
        measured = [
            t
            for t in after.values()
            if t.state.name == "COMPLETE" and not t.user_attrs.get("duplicate_of")
        ]
        assert len(measured) == BUDGET, {
            n: t.state.name for n, t in after.items()
        }  # the budget, in full

        # One result reaches the operator: the summary of a succeeded worker, the whole study's.
        summaries = [pod_summary(client.ApiClient().sanitize_for_serialization(p)) for p in pods]
        chosen = _job_pod(summaries, job_name)
        assert chosen is not None and chosen["name"] != victim
        summary = json.loads(chosen["message"])
        assert summary["status"] == "succeeded" and summary["trialsCompleted"] == BUDGET, summary
        others = [json.loads(s["message"]) for s in summaries if s["phase"] == "Succeeded"]
        assert (
            len({json.dumps(s["best"], sort_keys=True) for s in others}) == 1
        )  # same finished study
    finally:
        pg.stop()
        agent.nodes = {k: v for k, v in agent.nodes.items() if k not in {n.name for n in added}}
        for n in added:
            with contextlib.suppress(client.ApiException):
                core.delete_node(n.name)
