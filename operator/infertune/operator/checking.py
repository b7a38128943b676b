"""The keep-checking loop for one InferenceService (called by a kopf timer): observe live latency
and traffic, set SLOMet, and start a retune on a sustained violation, drift or a GPU change."""

from __future__ import annotations

import time
from typing import Any

from infertune.operator import canary
from infertune.operator.api import Observation
from infertune.operator.builders.deployment import deployment_name
from infertune.operator.conditions import get_condition, parse_iso
from infertune.operator.context import Ctx, InvalidSpecError, commit, load, log
from infertune.operator.drift import (
    REASON_HARDWARE,
    RetuneTimers,
    decide_retune,
    hardware_change,
    in_cooldown,
    observed_traffic,
    slo_check,
    traffic_drift,
    tuned_traffic,
)
from infertune.operator.monitor import Live, PrometheusError, Window, summarise
from infertune.operator.rollout import ensure_serving, roll_out
from infertune.operator.runtime import Runtime
from infertune.operator.tuning_run import start_run
from infertune.tuner.gpu_identity import GpuIdentity, gpu_identity

MATERIAL = 0.10  # relative change of a figure worth a status write (idle objects must stay quiet)


def epoch(iso: str | None) -> float | None:
    moment = parse_iso(iso)
    return moment.timestamp() if moment else None


def material_change(old: Observation | None, new: Observation) -> bool:
    """Whether a new observation is worth writing: SLO verdict or violations changed, or a figure
    moved by more than 10%. Keeps an idle or steady service to near-zero writes per hour."""
    if (
        old is None
        or old.slo_met != new.slo_met
        or old.violating != new.violating
        or old.source != new.source
    ):
        return True
    a, b = old.figures.model_dump(), new.figures.model_dump()
    for key, value in b.items():
        before = a.get(key)
        if (before is None) != (value is None):
            return True
        if before is not None and value is not None:
            scale = max(abs(before), abs(value), 1e-9)
            if abs(value - before) / scale > MATERIAL:
                return True
    return False


def _serving_pods(
    pods: list[dict[str, Any]], track: str = "stable", ready_only: bool = True
) -> list[dict[str, Any]]:
    """Ready (or, with ready_only False, all addressable) serving pods of one track (by label: a
    canary's pod names share the stable prefix). A pod that ended (Failed: evicted; Succeeded)
    is not addressable: it keeps its podIP in its status while the IP may go to another pod."""
    return [
        p for p in pods
        if p.get("component") == "serving" and p.get("track", "stable") == track and p.get("ip")
        and (p.get("ready") or not ready_only) and p.get("phase") not in ("Failed", "Succeeded")
    ]  # fmt: skip


async def _from_prometheus(ctx: Ctx, interval: float, track: str) -> Window | None:
    """The window from PromQL, or None (with the MetricsSource condition saying why) when
    Prometheus cannot answer: the caller then reads the pods themselves."""
    rt, isvc = ctx.rt, ctx.isvc
    assert rt.prometheus is not None
    service = rt.service(ctx.key)
    regex = f"{deployment_name(isvc, track)}-[a-z0-9]+-[a-z0-9]+"
    try:
        window = await rt.prometheus.window(isvc.namespace, regex, interval)
    except PrometheusError as exc:
        # Stable wording (no timestamps, no ports that change) so a steady outage writes once.
        ctx.condition(
            "MetricsSource",
            "False",
            "PrometheusUnavailable",
            f"Prometheus at {rt.prometheus.url} did not answer ({exc}); "
            "reading the serving pods' /metrics directly",
        )
        if service.prometheus_down != str(exc):
            log.warning("%s/%s: Prometheus unavailable (%s): scraping pods", *ctx.key, exc)
        service.prometheus_down = str(exc)
        return None
    if service.prometheus_down is not None:
        service.prometheus_down = None
        log.info("%s/%s: Prometheus answers again", *ctx.key)
    ctx.condition("MetricsSource", "True", "Prometheus", f"PromQL on {rt.prometheus.url}")
    return window


async def _observe(
    ctx: Ctx, pods: list[dict[str, Any]], track: str = "stable"
) -> tuple[Live | None, Live | None, str]:
    """(the check window for SLO verdicts, the window for the traffic's shape, the source)."""
    rt, isvc = ctx.rt, ctx.isvc
    interval = float(isvc.spec.retune.check_interval)
    if rt.prometheus is not None:
        window = await _from_prometheus(ctx, interval, track)
        if window is not None:
            live = summarise(window, isvc.spec.slo)
            return live, live, "prometheus"  # its windows span MIN_WINDOW_S already
    port = rt.settings.serving_port
    targets = {p["uid"]: f"http://{p['ip']}:{port}/metrics" for p in _serving_pods(pods, track)}
    # Unready and terminating pods too: one that stalled answered requests the verdict must see.
    present = {
        p["uid"]: f"http://{p['ip']}:{port}/metrics"
        for p in _serving_pods(pods, track, ready_only=False)
    }
    scraper = rt.scraper(ctx.key, track)
    # Even with no pod left: the pods that went get their last scrape, then are forgotten.
    windows = await scraper.windows(targets, present) if present or scraper.history else None
    if windows is None:
        return None, None, "scrape"
    slo = isvc.spec.slo
    return summarise(windows.recent, slo), summarise(windows.traffic, slo), "scrape"


async def _check_canary(ctx: Ctx, pods: list[dict[str, Any]]) -> None:
    run = ctx.status.canary
    assert run is not None
    spec = ctx.isvc.spec
    live, _, _ = await _observe(ctx, pods, canary.CANARY)
    if live is not None:
        met, violating = slo_check(spec.slo, live.at_percentile)
        run = canary.record(run, met, violating, ctx.now)
        ctx.status.canary = run
    now = time.time()
    started, proving = epoch(run.started_at), epoch(run.proving_since)
    judgement = canary.judge(
        run,
        now - started if started is not None else 0.0,
        now - proving if proving is not None else None,
        float(spec.rollout.canary.window),
        spec.rollout.rollback_on_slo_breach,
    )
    if judgement.verdict == "wait":
        return
    promoted = await canary.finish(ctx, judgement)
    if promoted is not None:
        await roll_out(ctx, promoted)
    elif ctx.status.live is not None:
        await ensure_serving(ctx, ctx.status.live)  # back to full replicas if it ran in place


def due(rt: Runtime, key: tuple[str, str], interval: float, now: float) -> bool:
    service = rt.service(key)
    last = service.last_check
    if last is not None and now - last < interval - rt.settings.monitor_tick_s / 2:
        return False
    service.last_check = now
    return True


async def check(
    rt: Runtime, body: Any, pods: list[dict[str, Any]], nodes: dict[str, GpuIdentity | None]
) -> None:
    try:
        ctx = load(rt, body)
    except InvalidSpecError:
        return
    st, spec = ctx.status, ctx.isvc.spec
    if st.live is None or not due(rt, ctx.key, float(spec.retune.check_interval), time.monotonic()):
        return
    live, traffic, source = await _observe(ctx, pods)
    now = time.monotonic()
    service = rt.service(ctx.key)
    timers = service.timers
    violating: list[str] = []
    if live is not None and traffic is not None:
        met, violating = slo_check(spec.slo, live.at_percentile)
        enough = traffic.requests >= rt.settings.min_requests_for_drift
        if enough:  # what a retune is given, even if the last window is thin
            service.traffic_seen = traffic
        # Per replica on both sides: the tuner loaded one replica; the live rate sums the pods.
        serving = len(_serving_pods(pods)) or spec.rollout.replicas
        drift = (
            traffic_drift(
                tuned_traffic(st.live, spec.traffic, spec.rollout.replicas),
                traffic.figures,
                spec.retune,
                replicas=serving,
            )
            if enough
            else None
        )
        timers.update(now, violated=None if met is None else not met, drifted=drift)
        if met is None:
            ctx.condition("SLOMet", "Unknown", "NoTraffic", "no requests in the last check window")
            rt.metrics.slo_checks.labels(*ctx.key, "no_traffic").inc()
        else:
            obs = Observation(
                time=ctx.now, source=source, figures=live.figures, slo_met=met, violating=violating
            )
            shown = get_condition(st.conditions, "SLOMet")
            verdict = "True" if met else "False"
            if material_change(st.observed, obs) or shown is None or shown.status != verdict:
                # The condition's message carries figures, so it moves with the observation only.
                st.observed = obs
                seen = ", ".join(
                    f"{m} {v:.1f}ms" for m, v in live.at_percentile.items() if v is not None
                )
                message = f"live {seen}" if met else "; ".join(violating)
                ctx.condition("SLOMet", verdict, "SLOMet" if met else "SLOViolated", message)
            rt.metrics.slo_met.labels(*ctx.key).set(1 if met else 0)
            rt.metrics.slo_checks.labels(*ctx.key, "met" if met else "violated").inc()
    if st.canary is not None:
        # A canary is the pending answer: judge it; no retune decisions until it is settled.
        await _check_canary(ctx, pods)
        await commit(ctx)
        return
    found = {nodes.get(p.get("node") or "") for p in _serving_pods(pods)}
    products = {gpu for gpu in found if gpu is not None}
    tuned_on = gpu_identity(st.tuning.gpu_product, st.tuning.gpu_memory_mib) if st.tuning else None
    hardware = hardware_change(tuned_on, products)
    tuned = get_condition(st.conditions, "Tuned")
    if tuned is not None and tuned.reason == "Tuning":
        await commit(ctx)
        return  # a run is already going; its result decides
    cooling = in_cooldown(epoch(st.last_retune_time), time.time(), float(spec.retune.cooldown))
    decision = decide_retune(
        spec.retune, timers, now, violating=violating, hardware=hardware, in_cooldown_now=cooling
    )
    if decision.reason is not None and decision.cooldown:
        if service.cooldown_noted != decision.reason:
            service.cooldown_noted = decision.reason
            log.info("%s/%s: %s held back by the cooldown", *ctx.key, decision.reason)
    elif decision.reason is not None:
        service.cooldown_noted = None
        tuning = spec.tuning_spec()
        recent = service.traffic_seen
        if recent is not None:
            clamped: list[str] = []
            shape = observed_traffic(
                tuning.traffic, recent.figures, recent.prompt_p95, recent.output_p95, clamped
            )
            for note in clamped:
                log.info("%s/%s: %s", *ctx.key, note)
                ctx.history("TrafficClamped", decision.reason, note)
            tuning = tuning.model_copy(update={"traffic": shape})
        moved = [g for g in products if tuned_on is None or not g.same_as(tuned_on)]
        gpu = min(moved, key=str) if decision.reason == REASON_HARDWARE and moved else None
        ctx.event(
            "Warning" if decision.reason != REASON_HARDWARE else "Normal",
            decision.reason,
            decision.message,
        )
        ctx.history("RetuneTriggered", decision.reason, decision.message)
        await start_run(ctx, decision.reason, tuning, gpu=gpu)
        service.timers, service.traffic_seen = RetuneTimers(), None
    await commit(ctx)
