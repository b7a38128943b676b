"""Prometheus metrics under vLLM's names, so one monitor reads this engine and vLLM alike.

Each server gets its own :class:`~prometheus_client.CollectorRegistry` (several engines may run
in one process during tests and trials). Gauges read the engine's live state at scrape time
instead of being pushed every step.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from infertune.engine.engine import EngineStats

__all__ = ["CONTENT_TYPE", "EngineMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Fine at the low end so that millisecond SLOs (e.g. ITL p95 <= 20 ms) fall between buckets.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06,
    0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITL_BUCKETS = (0.0005, *LATENCY_BUCKETS[:-3], 20.0)
E2E_BUCKETS = (*LATENCY_BUCKETS, 160.0, 320.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class EngineMetrics:
    """Every series the server exports; ``observe_*`` are called from the event loop."""

    def __init__(self, model_name: str, stats: EngineStats) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        reg = self.registry

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            h = Histogram(name, doc, labels, buckets=buckets, registry=reg)
            return h.labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg).labels(model_name)

        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Time to first token.", LATENCY_BUCKETS
        )
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS)
        # vLLM's older name for the same per-gap series; monitors written for it still work.
        self.tpot = hist(
            "vllm:time_per_output_token_seconds", "Time per output token (per gap).", ITL_BUCKETS
        )
        self.request_tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Per-request mean time per output token after the first.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS
        )
        self.queue_time = hist(
            "vllm:request_queue_time_seconds", "Time spent waiting to be scheduled.", E2E_BUCKETS
        )
        self.prompt_len = hist(
            "vllm:request_prompt_tokens", "Prompt length of finished requests.", TOKEN_BUCKETS
        )
        self.gen_len = hist(
            "vllm:request_generation_tokens",
            "Generated length of finished requests.",
            TOKEN_BUCKETS,
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self._success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=reg,
        )
        self._success_by_reason = {
            r: self._success.labels(model_name, r) for r in ("stop", "length", "abort")
        }
        self.rejected = counter(
            "infertune:request_rejected", "Requests refused with 503 (queue full)."
        )

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg).labels(model_name)

        gauge("vllm:num_requests_running", "Requests in the running batch.").set_function(
            lambda: stats.num_running
        )
        gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.").set_function(
            lambda: stats.num_waiting
        )
        gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).").set_function(
            lambda: stats.kv_usage
        )
        # vLLM's name for the same gauge before v0.10; older dashboards still query it.
        gauge("vllm:gpu_cache_usage_perc", "Alias of vllm:kv_cache_usage_perc.").set_function(
            lambda: stats.kv_usage
        )
        self._preemptions = Counter(
            "vllm:num_preemptions", "Sequences preempted (recompute).", labels, registry=reg
        ).labels(model_name)
        self._seen_preemptions = 0
        self._stats = stats

    def observe_finished(
        self,
        *,
        reason: str,
        prompt_tokens: int,
        token_times: list[float],
        arrival: float,
        end: float,
        queue_time: float | None,
    ) -> None:
        """Record one finished request from its arrival time and its tokens' timestamps."""
        n = len(token_times)
        self._success_by_reason.get(reason, self._success_by_reason["abort"]).inc()
        self.prompt_len.observe(prompt_tokens)
        self.gen_len.observe(n)
        self.e2e.observe(max(0.0, end - arrival))
        if queue_time is not None:
            self.queue_time.observe(queue_time)
        if n >= 2:
            self.request_tpot.observe((token_times[-1] - token_times[0]) / (n - 1))

    def observe_tokens(self, arrival: float, previous: float | None, times: list[float]) -> None:
        """Record the latency of newly streamed tokens (``previous``: the last token's time)."""
        for t in times:
            if previous is None:
                self.ttft.observe(max(0.0, t - arrival))
            else:
                gap = max(0.0, t - previous)
                self.itl.observe(gap)
                self.tpot.observe(gap)
            previous = t
        self.generation_tokens.inc(len(times))

    def render(self) -> bytes:
        new = self._stats.num_preemptions - self._seen_preemptions
        if new > 0:
            self._preemptions.inc(new)
            self._seen_preemptions += new
        return bytes(generate_latest(self.registry))
