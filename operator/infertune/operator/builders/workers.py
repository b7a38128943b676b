"""Parallel tuning workers: `budget.parallelTrials: N` makes the tuning Job run N pods at once
(parallelism = completions = N), each an `infertune tune --workers N` process on the same study
in the operator's study storage (the chart's PostgreSQL or an external database).

The workers are interchangeable, so the Job is not Indexed: nothing is partitioned by index
(the study in the storage hands out trials and counts the budget), a replacement pod for a lost
worker simply joins the study, and Kubernetes 1.20 (no completionMode) runs it the same. Every
worker waits for the others' running trials before it writes its summary, so each summary is the
finished study's; the operator ingests one (tuning_run.ingest_job, once the Job is Complete).

Placement: one worker per node where the nodes allow (preferred anti-affinity on the hostname),
otherwise one worker per GPU of a multi-GPU node (each pod requests its own gpusPerReplica GPUs, so
two workers never share a GPU), and every worker on the same GPU product (required pod affinity on
nvidia.com/gpu.product) when the spec lets the run choose among several: one study must compare
measurements made on the same hardware.
"""

from __future__ import annotations

from infertune.operator.builders.common import GPU_PRODUCT_LABEL, LABEL_ISVC, Obj

HOSTNAME_LABEL = "kubernetes.io/hostname"


def worker_args(workers: int) -> list[str]:
    return ["--workers", str(workers)] if workers > 1 else []


def parallel_job_fields(workers: int) -> Obj:
    """The Job spec's fields for `workers` pods at once (none for one: the Job is unchanged)."""
    return {"parallelism": workers, "completions": workers} if workers > 1 else {}


def worker_affinity(
    workers: int, run_labels: dict[str, str], *, gpus: int, products: list[str]
) -> Obj:
    """Pod (anti-)affinity among one run's workers, to merge into the pod's `affinity`."""
    if workers <= 1:
        return {}
    selector = {"matchLabels": {k: run_labels[k] for k in sorted(run_labels)}}
    out: Obj = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {"labelSelector": selector, "topologyKey": HOSTNAME_LABEL},
                }
            ]
        }
    }
    if gpus > 0 and len(products) != 1:
        out["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": selector, "topologyKey": GPU_PRODUCT_LABEL}
            ]
        }
    return out


def run_selector(pod_labels: dict[str, str], run_label: str) -> dict[str, str]:
    """The labels that pick one run's workers: the run id and the InferenceService."""
    return {k: pod_labels[k] for k in (run_label, LABEL_ISVC) if k in pod_labels}
