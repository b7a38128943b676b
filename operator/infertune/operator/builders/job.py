"""The tuning Job: the tuner image on a matching GPU node, spec from a ConfigMap, result in the
pod's termination message (the pod needs no Kubernetes API rights at all)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from infertune.operator.api import InferenceService
from infertune.operator.builders.common import (
    ANN_SPEC,
    FETCH_CONTAINER,
    Obj,
    child_name,
    container_security_context,
    hf_uris,
    metadata,
    model_cache,
    model_location,
    model_volumes,
    placement,
    pod_security_context,
    pull_secrets,
    resources,
    stamp,
    writable_dirs,
)
from infertune.operator.builders.configmap import SPEC_KEY
from infertune.operator.builders.workers import (
    parallel_job_fields,
    run_selector,
    worker_affinity,
    worker_args,
)
from infertune.operator.engine_runtime import TUNING_POD
from infertune.operator.settings import OperatorSettings
from infertune.tuner.api import TuningSpec
from infertune.tuner.fetch_cli import EXIT_PERMANENT

SPEC_DIR = "/etc/infertune"
OUT_DIR = "/var/run/infertune/out"
TERMINATION_LOG = "/dev/termination-log"
LABEL_RUN = "infertune.dev/run"
LABEL_REASON = "infertune.dev/run-reason"


class RunPlan(BaseModel):
    """One tuning run, decided by the operator before anything is created."""

    model_config = ConfigDict(frozen=True)

    run_id: str  # 8 hex chars: hash of what the run is given, plus a retune counter
    spec_hash: str  # tuning hash of the user's spec when the run started
    run_hash: str  # hash of the TuningSpec actually handed over (observed traffic included)
    reason: str  # Created, SpecChanged, SLOViolation, TrafficDrift, HardwareChanged
    tuning: TuningSpec
    gpu_product: str | None = None  # pin to this product (a hardware-change retune)

    def job_name(self, isvc: str) -> str:
        return child_name(isvc, f"tune-{self.run_id}")

    def study_name(self, namespace: str, isvc: str) -> str:
        # Per run, not per spec: a retune on unchanged traffic (an SLO miss with no drift) hands
        # the tuner the very spec of the first run, and a study named after the spec would resume
        # that finished study and return its old answer without measuring. A retried pod of the
        # same run keeps the run's id, so it still resumes its own study.
        return f"{namespace}-{isvc}-{self.run_id}"


def replica_share(tuning: TuningSpec, replicas: int) -> TuningSpec:
    """One replica's share of the service's traffic: `traffic.rate` is the service's total, and a
    trial loads one replica, so it gets rate / replicas (0 replicas count as 1). A closed-loop
    `concurrency` is per replica already and is left alone."""
    rate = tuning.traffic.rate
    if rate is None or replicas <= 1:
        return tuning
    traffic = tuning.traffic.model_copy(update={"rate": round(rate / replicas, 6)})
    return tuning.model_copy(update={"traffic": traffic})


def pod_tuning_spec(tuning: TuningSpec, replicas: int = 1) -> TuningSpec:
    """The spec as the pod sees it: one replica's share of the traffic (:func:`replica_share`),
    and a pvc:// or file:// model becomes the path it is mounted at."""
    tuning = replica_share(tuning, replicas)
    path, vols, _ = model_location(tuning.model.uri)
    if not vols:
        return tuning
    model = tuning.model.model_copy(
        update={"uri": f"file://{path}", "name": tuning.model.served_name}
    )
    return tuning.model_copy(update={"model": model})


def gpu_price_args(isvc: InferenceService, settings: OperatorSettings) -> list[str]:
    """The GPU prices a cost-per-token run ranks by: the spec's own price (any product), else the
    operator's price per product (the tuner picks the one it runs on)."""
    if isvc.spec.slo.objective != "cost-per-token":
        return []
    own = isvc.spec.hardware.gpu_hourly_price
    prices = (
        [f"{own:g}"]
        if own is not None
        else [
            f"{product}={price:g}" for product, price in sorted(settings.gpu_hourly_prices.items())
        ]
    )
    return [arg for price in prices for arg in ("--gpu-hourly-price", price)]


def tuner_argv(plan: RunPlan, isvc: InferenceService, settings: OperatorSettings) -> list[str]:
    argv = [
        *settings.infertune_command,
        "tune",
        f"{SPEC_DIR}/{SPEC_KEY}",
        "--study-name",
        plan.study_name(isvc.namespace, isvc.name),
    ]
    if settings.storage_secret_ref is not None:
        argv += ["--storage", "$(INFERTUNE_STORAGE_URL)"]  # expanded by the kubelet
    argv += gpu_price_args(isvc, settings)
    argv += worker_args(plan.tuning.budget.parallel_trials)
    return [*argv, "--out", OUT_DIR, "--termination-message", TERMINATION_LOG]


def active_deadline(tuning: TuningSpec) -> int:
    """The study's own wall-time cap plus room to start, profile and write the result."""
    return int(float(tuning.budget.max_duration) * 1.5 + float(tuning.budget.trial_timeout) + 600)


def desired_job(isvc: InferenceService, plan: RunPlan, settings: OperatorSettings) -> Obj:
    name = plan.job_name(isvc.name)
    meta = metadata(isvc, name, "tuning", **{LABEL_RUN: plan.run_id, LABEL_REASON: plan.reason})
    meta["annotations"][ANN_SPEC] = plan.spec_hash
    model_vols, model_mounts = model_volumes(isvc.spec.model)
    tmp_vols, tmp_mounts, tmp_env = writable_dirs(TUNING_POD, isvc.spec.hardware.memory)
    env: list[Obj] = [*tmp_env, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    ref = settings.storage_secret_ref
    if ref is not None:
        env.append(
            {
                "name": "INFERTUNE_STORAGE_URL",
                "valueFrom": {"secretKeyRef": {"name": ref[0], "key": ref[1]}},
            }
        )
    # hf:// models (model.uri, variants): fetched by the init step, read from the cache volume.
    cache_vols, cache_mount, cache_env, init = model_cache(
        isvc, settings, hf_uris(isvc.spec.model), tmp_vols
    )
    env += cache_env
    container: Obj = {
        "name": "tuner",
        "image": settings.tuner_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": tuner_argv(plan, isvc, settings),
        "env": env,
        "resources": resources(isvc),
        "securityContext": container_security_context(),
        "terminationMessagePath": TERMINATION_LOG,
        # The tuner writes its compact JSON summary there; if it crashes first, the log tail says why.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "out", "mountPath": "/var/run/infertune"},
            *tmp_mounts,
            *model_mounts,
            *([cache_mount] if cache_mount else []),
        ],
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
        # The tuner talks to no API: no token in the pod at all.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        **({"initContainers": init} if init else {}),
        "containers": [container],
        "volumes": [
            {"name": "spec", "configMap": {"name": name}},
            {"name": "out", "emptyDir": {}},
            *tmp_vols,
            *model_vols,
            *cache_vols,
        ],
        **placement(isvc, plan.gpu_product),
    }
    if settings.tuning_service_account:
        pod_spec["serviceAccountName"] = settings.tuning_service_account
    # The operator's pull secrets (the chart's, cluster-wide or not) and the service's own.
    pod_spec.update(pull_secrets(isvc, settings))
    pod_labels = {k: v for k, v in meta["labels"].items()}
    workers = plan.tuning.budget.parallel_trials  # builders/workers.py: one study, N pods
    products = [plan.gpu_product] if plan.gpu_product else isvc.spec.hardware.gpu_products
    spread = worker_affinity(workers, run_selector(pod_labels, LABEL_RUN),
                             gpus=isvc.spec.hardware.gpus_per_replica, products=products)  # fmt: skip
    if spread:
        pod_spec["affinity"] = {**pod_spec.get("affinity", {}), **spread}
    job_spec: Obj = {
        "backoffLimit": settings.job_backoff_limit,
        "activeDeadlineSeconds": active_deadline(plan.tuning),
        "template": {"metadata": {"labels": pod_labels}, "spec": pod_spec},
        **parallel_job_fields(workers),
    }
    if init:
        job_spec["podFailurePolicy"] = fetch_failure_policy()
    return stamp({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec})


def fetch_failure_policy() -> Obj:
    """A missing repository or revision, or a refused token, fails the Job at once instead of
    retrying the pod backoffLimit times (Kubernetes 1.26+; on older clusters the operator stops
    the run itself when it reads the failed init step, tuning_run.fetch_failure)."""
    exit_codes = {"containerName": FETCH_CONTAINER, "operator": "In", "values": [EXIT_PERMANENT]}
    # onPodConditions empty but present: the published schemas of 1.25-1.28 mark it required.
    rule = {"action": "FailJob", "onExitCodes": exit_codes, "onPodConditions": []}
    return {"rules": [rule]}
