"""The tuning run of an InferenceService: start its Job, ingest the tuner's result when the Job
finishes (the winner then goes to rollout.replace_live), and the timer's read-back of children
whose events came too early to count (resync_children)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from infertune.operator.api import TuningRun
from infertune.operator.builders import RunPlan, desired_job, desired_spec_configmap
from infertune.operator.builders.deployment import served_uri
from infertune.operator.builders.job import pod_tuning_spec
from infertune.operator.conditions import get_condition, parse_iso
from infertune.operator.context import Ctx, commit, load_owner, load_status, log
from infertune.operator.drift import beats_live
from infertune.operator.hashing import config_hash, digest, run_hash, tuning_hash
from infertune.operator.model_fetch import (
    describe_failure,
    fetch_failure,
    fetched_bytes,
    is_permanent,
)
from infertune.operator.pods import pod_summary
from infertune.operator.rollout import deployment_state, describe, on_deployment, replace_live
from infertune.operator.runtime import Runtime
from infertune.operator.summary import Summary, parse_summary
from infertune.tuner.api import TuningSpec
from infertune.tuner.gpu_identity import GpuIdentity, gpu_identity

USER_REASONS = ("Created", "SpecChanged")
# How often an unsettled child is read back by the timer (see resync_children).
CHILD_RESYNC_S = 30.0


async def start_run(
    ctx: Ctx, reason: str, tuning: TuningSpec, gpu: GpuIdentity | None = None
) -> None:
    """Start a run on `tuning` (the service's total traffic: the pod gets one replica's share),
    pinned to `gpu`'s product when given (a hardware-change retune)."""
    rt, isvc, st = ctx.rt, ctx.isvc, ctx.status
    replicas = isvc.spec.rollout.replicas
    pod_spec = pod_tuning_spec(tuning, replicas)
    gpu_product = gpu.product if gpu is not None else None
    rhash = run_hash(pod_spec, gpu_product)
    # Deterministic per decision: a retried handler finds the Job it already created.
    run_id = digest(
        [rhash, reason, ctx.generation, st.last_retune_time, st.tuning.job if st.tuning else None]
    )[:8]
    plan = RunPlan(
        run_id=run_id,
        spec_hash=tuning_hash(isvc.spec),
        run_hash=rhash,
        reason=reason,
        tuning=pod_spec,
        gpu_product=gpu_product,
    )
    job_name = plan.job_name(isvc.name)
    previous = st.tuning.job if st.tuning else None
    # Both at once: one API round trip less between `kubectl apply` and the Job (the pod that
    # mounts the ConfigMap is only created after the Job, by the Job controller).
    await asyncio.gather(
        rt.kube.create(desired_spec_configmap(isvc, job_name, pod_spec)),
        rt.kube.create(desired_job(isvc, plan, rt.settings)),
    )
    if previous and previous != job_name:
        # A superseded run: its result is already in the status or no longer wanted.
        await rt.kube.delete("Job", isvc.namespace, previous)
        await rt.kube.delete("ConfigMap", isvc.namespace, previous)
    st.tuning = TuningRun(
        job=job_name,
        study=plan.study_name(isvc.namespace, isvc.name),
        spec_hash=plan.spec_hash,
        reason=reason,
        trials_total=pod_spec.budget.max_trials,
        started_at=ctx.now,
        gpu_product=gpu_product,
        gpu_memory_mib=gpu.memory_mib if gpu is not None else None,
        replicas=max(1, replicas),
        replica_rate=pod_spec.traffic.rate,
    )
    message = f"tuning Job {job_name} started ({reason}); study {st.tuning.study}"
    ctx.condition("Tuned", "Unknown", "Tuning", message)
    if st.profile is None:
        ctx.condition("Profiled", "Unknown", "Profiling", f"profiling in Job {job_name}")
    ctx.history("TuningStarted", reason, message)
    ctx.event("Normal", "TuningStarted", message)
    # Every run starts the cooldown clock, the first included: a retune right after it (an SLO
    # miss while the first config settles, a GPU seen differently) would hold a GPU again at once.
    st.last_retune_time = ctx.now
    if reason not in USER_REASONS:
        rt.metrics.retunes.labels(reason).inc()


def _job_finished(job: dict[str, Any]) -> str | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return None


def _job_pod(pods: list[dict[str, Any]], job_name: str) -> dict[str, Any] | None:
    """The pod whose summary is the run's: the last to finish, a succeeded one first (with
    parallel workers, a lost worker's pod may end after the others; its message is a log tail)."""
    mine = [p for p in pods if p.get("job") == job_name and p.get("terminated")]
    return max(
        mine,
        key=lambda p: (p.get("phase") == "Succeeded", p.get("finished_at") or ""),
        default=None,
    )


async def ingest_job(
    rt: Runtime,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    nodes: dict[str, GpuIdentity | None],
) -> None:
    """A tuning Job finished: read the tuner's summary from the pod's termination message. A Job
    whose hf:// fetch failed for good ends the run before the Job's own retries (fetch_failed)."""
    outcome = _job_finished(job)
    if outcome is None:
        if (job.get("status") or {}).get("failed"):
            await fetch_failed(rt, job)
        return
    meta = job["metadata"]
    ctx = await load_owner(rt, meta["namespace"], meta["labels"]["infertune.dev/inferenceservice"])
    if ctx is None:
        return
    run = ctx.status.tuning
    if run is None or run.job != meta["name"] or run.finished_at is not None:
        return  # superseded, or already ingested (a restart replays every Job)
    # Read the Job's pods now: the pod watch may not have delivered the terminated state yet.
    found = await rt.kube.list("Pod", meta["namespace"], f"job-name={meta['name']}")
    summaries = [pod_summary(p) for p in found] or pods
    pod = _job_pod(summaries, meta["name"])
    failed_fetch = fetch_failure(summaries) if pod is None else None
    if failed_fetch is not None:  # no pod got past its fetch: say which field and why
        _fetch_run_failed(ctx, failed_fetch)
        rt.metrics.tuning_runs.labels(run.reason or "", "failed").inc()
        await commit(ctx)
        return
    if ctx.isvc.spec.model.hf_uris() and outcome == "Complete":
        ctx.condition("ModelFetched", "True", "Fetched", "hf:// model in the model cache")
    summary = parse_summary(pod.get("message") if pod else None)
    run.finished_at = ctx.now
    started = parse_iso(run.started_at)
    finished = parse_iso(ctx.now)
    duration = (finished - started).total_seconds() if started and finished else None
    if isinstance(summary, str) or summary.status == "failed":
        why = (
            summary
            if isinstance(summary, str)
            else (summary.reason or "the tuner reported a failure")
        )
        if outcome == "Failed" and isinstance(summary, str):
            why = f"Job {meta['name']} failed: {why}"
        _run_failed(ctx, "TuningFailed", why)
        result = "failed"
    else:
        result = summary.status
        await _ingest_summary(ctx, summary, pod, nodes)
    rt.metrics.tuning_runs.labels(run.reason or "", result).inc()
    if duration is not None:
        rt.metrics.tuning_duration.labels(result).observe(duration)
    await commit(ctx)


def _run_failed(ctx: Ctx, reason: str, why: str) -> None:
    """A run ended without a result: Tuned (and Profiled, if never profiled) False, history, event."""
    run = ctx.status.tuning
    ctx.condition("Tuned", "False", reason, why)
    if ctx.status.profile is None:
        ctx.condition("Profiled", "False", reason, why)
    ctx.history("TuningFailed", (run.reason if run else None) or "", why)
    ctx.event("Warning", reason, why)


def _fetch_run_failed(ctx: Ctx, failed: dict[str, Any]) -> None:
    """The run ends on a failed fetch: ModelFetched False with the field and the Hub's answer,
    Tuned False (ModelFetchFailed), history and a Warning event."""
    run = ctx.status.tuning
    reason, message, _ = describe_failure(ctx.isvc, failed)
    if run is not None:
        run.finished_at = ctx.now
    ctx.condition("ModelFetched", "False", reason, message)
    _run_failed(ctx, "ModelFetchFailed", message)
    ctx.event("Warning", reason, message)


async def fetch_failed(rt: Runtime, job: dict[str, Any]) -> None:
    """A pod of a running Job failed: when its fetch failed for good (a missing repository or
    revision, a refused token), end the run now and delete the Job, so neither the Job's
    backoffLimit retries nor a cluster without podFailurePolicy (before 1.26) fetch again."""
    meta = job["metadata"]
    found = await rt.kube.list("Pod", meta["namespace"], f"job-name={meta['name']}")
    failed = fetch_failure([pod_summary(p) for p in found])
    if failed is None or not is_permanent(failed):
        return
    ctx = await load_owner(rt, meta["namespace"], meta["labels"]["infertune.dev/inferenceservice"])
    if ctx is None:
        return
    run = ctx.status.tuning
    if run is None or run.job != meta["name"] or run.finished_at is not None:
        return
    _fetch_run_failed(ctx, failed)
    rt.metrics.tuning_runs.labels(run.reason or "", "failed").inc()
    await commit(ctx)
    await rt.kube.delete("Job", meta["namespace"], meta["name"])


async def resync_children(
    rt: Runtime, body: Any, pods: list[dict[str, Any]], nodes: dict[str, GpuIdentity | None]
) -> bool:
    """Level-triggered backstop for the Job and Deployment watches (called by the timer).

    The watch events are the fast path, but one can come too early to count: a Job that
    finishes, or a Deployment that becomes available, while the handler that created it is
    still retrying its status write (409, 429, an API server restart) is seen before the status
    names it and is ignored, and a finished Job or a settled Deployment sends no further
    events. So while a run is pending or a rollout unsettled, the child is read back at most
    every CHILD_RESYNC_S per object (an idle, settled fleet costs no reads) and, if it has
    settled, handled as its event would have been. True when something was handled."""
    status = load_status(body.get("status"))
    run = status.tuning
    job_name = run.job if run is not None and run.finished_at is None else None
    rolled = get_condition(status.conditions, "RolledOut")
    rolling = status.live is not None and (rolled is None or rolled.status == "Unknown")
    if not job_name and not rolling:
        return False
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    now = time.monotonic()
    service = rt.service(key)
    if now - service.children_resynced < CHILD_RESYNC_S:
        return False
    service.children_resynced = now
    if job_name:
        job = await rt.kube.get("Job", meta["namespace"], job_name)
        if job is None:
            return await _job_lost(rt, meta["namespace"], meta["name"], job_name)
        if _job_finished(job) is not None:
            log.info(
                "%s/%s: Job %s finished without its result ingested; ingesting now", *key, job_name
            )
            await ingest_job(rt, job, pods, nodes)
            return True
    if rolling:
        dep = await rt.kube.get("Deployment", meta["namespace"], meta["name"])  # the stable one
        if dep is not None and deployment_state(dep)[0] != "Unknown":
            log.info("%s/%s: Deployment settled without its state recorded; recording", *key)
            await on_deployment(rt, dep)
            return True
    return False


async def _job_lost(rt: Runtime, namespace: str, name: str, job_name: str) -> bool:
    """The pending run's Job is gone before it finished (deleted by hand, or by a cleanup): say
    so instead of showing Tuning for ever. Read fresh first: the timer's body may predate a newer
    run (whose start deleted this Job on purpose); a run's Job is created before the status
    names it, so a Job missing while the fresh status names it was deleted."""
    ctx = await load_owner(rt, namespace, name)
    if ctx is None:
        return False
    run = ctx.status.tuning
    if run is None or run.job != job_name or run.finished_at is not None:
        return False
    if await rt.kube.get("Job", namespace, job_name) is not None:
        return False
    why = (
        f"tuning Job {job_name} was deleted before it finished; "
        "change the spec (or delete and re-apply the object) to start a new run"
    )
    log.warning("%s/%s: %s", namespace, name, why)
    run.finished_at = ctx.now
    _run_failed(ctx, "TuningJobLost", why)
    rt.metrics.tuning_runs.labels(run.reason or "", "lost").inc()
    await commit(ctx)
    return True


async def _ingest_summary(
    ctx: Ctx, summary: Summary, pod: dict[str, Any] | None, nodes: dict[str, GpuIdentity | None]
) -> None:
    st, run = ctx.status, ctx.status.tuning
    assert run is not None
    run.trials_completed = summary.trials_completed
    run.trials_total = summary.trials_total or run.trials_total
    run.warm_start_trials = summary.warm_start.prior_trials if summary.warm_start else 0
    run.advantage = summary.advantage()
    node_gpu = nodes.get(pod.get("node") or "") if pod else None
    # The GPU the result holds for: what the tuner saw, else the labels of the node it ran on.
    gpu = (
        gpu_identity(summary.gpu_product, summary.gpu_memory_mib)
        or node_gpu
        or gpu_identity(run.gpu_product, run.gpu_memory_mib)
    )
    if gpu is not None:
        run.gpu_product, run.gpu_memory_mib = gpu.product, gpu.memory_mib
    profile = summary.status_profile()
    if profile is not None:
        st.profile = profile
        phases = [
            f"{name} {p.bound}-bound"
            + (f" ({p.percent_of_roofline:.0f}% of roofline)" if p.percent_of_roofline else "")
            for name, p in (("prefill", profile.prefill), ("decode", profile.decode))
            if p is not None
        ]
        ctx.condition(
            "Profiled", "True", "Profiled", f"on {profile.hardware}: " + ", ".join(phases)
        )
    config = summary.serving_config()
    if config is None:
        why = summary.reason or "the tuner found no configuration that runs"
        ctx.condition("Tuned", "False", "NoConfiguration", why)
        ctx.event("Warning", "NoConfiguration", why)
        return
    # What the served hf:// checkpoint weighs, from the fetch step (sizes an emptyDir cache).
    config.model_bytes = fetched_bytes(pod, served_uri(ctx.isvc, config)) if pod else None
    image = ctx.rt.settings.image_for(config.candidate().engine)
    # The served URI, as the Deployment hashes it (a variant's, or a pinned hf:// revision).
    config.config_hash = config_hash(config, served_uri(ctx.isvc, config), image)
    st.best = config
    trials = f"{summary.trials_completed}/{summary.trials_total} trials"
    if summary.status == "succeeded":
        message = f"best: {describe(config)} ({trials})"
        ctx.condition("Tuned", "True", "Tuned", message)
    else:
        message = f"no configuration meets the SLOs: {summary.binding_constraint or summary.reason}; closest: {describe(config)} ({trials})"
        ctx.condition("Tuned", "False", "SLOInfeasible", message)
    ctx.history(
        "Tuned" if summary.status == "succeeded" else "Infeasible",
        run.reason or "",
        message,
        config.config_hash,
    )
    ctx.event(
        "Normal" if summary.status == "succeeded" else "Warning",
        "Tuned" if summary.status == "succeeded" else "SLOInfeasible",
        message,
    )
    live = st.live
    if live is None or (run.reason in USER_REASONS):
        await replace_live(ctx, config)
        return
    observed = st.observed
    ok, why = beats_live(
        config,
        live,
        observed.figures if observed else None,
        observed.violating if observed else [],
        ctx.isvc.spec.slo,
        ctx.rt.settings.min_gain,
    )
    if ok:
        ctx.history("RetuneAccepted", run.reason or "", why, config.config_hash)
        await replace_live(ctx, config)
    else:
        ctx.history("RetuneKept", run.reason or "", f"live config kept: {why}", live.config_hash)
        ctx.event("Normal", "RetuneKept", f"live config kept: {why}")


__all__ = ["USER_REASONS", "ingest_job", "resync_children", "start_run"]
