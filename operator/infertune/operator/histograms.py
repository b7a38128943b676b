"""Torch-free Prometheus histogram arithmetic: parse an exposition, difference two scrapes, and read
quantiles with the same linear interpolation as PromQL's histogram_quantile."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# The engines' metric families, named by vLLM's names (the built-in engine exposes the same ones);
# OTHER_NAMES below is the one table of what other engines and older versions call each of them.
TTFT = "vllm:time_to_first_token_seconds"
# Inter-token latency, one observation per gap between consecutive tokens (the SLO's `itl`
# percentile reads it). vLLM before 0.10 called the same histogram time_per_output_token (deprecated
# since); the built-in engine exports both names.
ITL = "vllm:inter_token_latency_seconds"
ITL_DEPRECATED = "vllm:time_per_output_token_seconds"
# One observation per request: its mean gap (goodput judges the ITL bound by it).
REQUEST_TPOT = "vllm:request_time_per_output_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
PROMPT = "vllm:request_prompt_tokens"
OUTPUT = "vllm:request_generation_tokens"
FAMILIES = (TTFT, ITL, REQUEST_TPOT, E2E, PROMPT, OUTPUT)
# SGLang's names for the same histograms, exported only when the server runs with --enable-metrics
# (read in sglang 0.5.23's sglang/srt/observability/metrics_collector.py, TokenizerMetricsCollector:
# time_to_first_token_seconds, inter_token_latency_seconds (one per gap),
# request_time_per_output_token_seconds (one per request), e2e_request_latency_seconds,
# prompt_tokens_histogram and generation_tokens_histogram, all observed per finished request).
SGLANG_NAMES = {
    TTFT: "sglang:time_to_first_token_seconds",
    ITL: "sglang:inter_token_latency_seconds",
    REQUEST_TPOT: "sglang:request_time_per_output_token_seconds",
    E2E: "sglang:e2e_request_latency_seconds",
    PROMPT: "sglang:prompt_tokens_histogram",
    OUTPUT: "sglang:generation_tokens_histogram",
}
# Every other name of a family, in order of preference after its own: a family is read under the
# first name an engine exports (an engine exporting two names counts each observation in both).
OTHER_NAMES: dict[str, tuple[str, ...]] = {
    name: ((ITL_DEPRECATED,) if name == ITL else ()) + (SGLANG_NAMES[name],) for name in FAMILIES
}


@dataclass
class Histogram:
    """Cumulative bucket counts by upper bound, plus sum and count (summed over label sets)."""

    buckets: dict[float, float] = field(default_factory=dict)
    sum: float = 0.0
    count: float = 0.0

    def add(self, other: Histogram) -> Histogram:
        buckets = dict(self.buckets)
        for le, n in other.buckets.items():
            buckets[le] = buckets.get(le, 0.0) + n
        return Histogram(buckets, self.sum + other.sum, self.count + other.count)

    def minus(self, earlier: Histogram) -> Histogram:
        """The increase since `earlier`; a counter reset (process restart) counts from zero."""
        if self.count < earlier.count:
            return self
        buckets = {le: max(0.0, n - earlier.buckets.get(le, 0.0)) for le, n in self.buckets.items()}
        return Histogram(buckets, max(0.0, self.sum - earlier.sum), self.count - earlier.count)

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def _sorted(self) -> list[tuple[float, float]]:
        return sorted(self.buckets.items())

    def quantile(self, q: float) -> float | None:
        """histogram_quantile(q): linear within the bucket; the +Inf bucket yields the last bound."""
        pairs = self._sorted()
        if not pairs or pairs[-1][1] <= 0:
            return None
        total = pairs[-1][1]
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for le, cum in pairs:
            if cum >= rank:
                if math.isinf(le):
                    return lower_bound
                if cum == lower_count:
                    return le
                return lower_bound + (le - lower_bound) * (rank - lower_count) / (cum - lower_count)
            lower_bound, lower_count = le, cum
        return lower_bound

    def fraction_below(self, bound: float) -> float | None:
        """Share of observations <= bound (interpolated inside the bucket that holds it)."""
        pairs = self._sorted()
        if not pairs or pairs[-1][1] <= 0:
            return None
        total = pairs[-1][1]
        lower_bound, lower_count = 0.0, 0.0
        for le, cum in pairs:
            if bound <= le:
                if math.isinf(le):
                    return lower_count / total
                share = (bound - lower_bound) / (le - lower_bound) if le > lower_bound else 1.0
                return (lower_count + (cum - lower_count) * share) / total
            lower_bound, lower_count = le, cum
        return 1.0


def parse_exposition(text: str, families: tuple[str, ...] = FAMILIES) -> dict[str, Histogram]:
    """The named histogram families from a /metrics text, each summed over its label sets."""
    older = {old: name for name in families for old in OTHER_NAMES.get(name, ())}
    out: dict[str, Histogram] = {}
    for family in text_string_to_metric_families(text):
        if (family.name not in families and family.name not in older) or family.type != "histogram":
            continue
        hist = out.setdefault(family.name, Histogram())
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                le = float(sample.labels["le"])
                hist.buckets[le] = hist.buckets.get(le, 0.0) + float(sample.value)
            elif sample.name.endswith("_sum"):
                hist.sum += float(sample.value)
            elif sample.name.endswith("_count"):
                hist.count += float(sample.value)
    for old, name in older.items():
        # An engine exporting two names counts each observation in both: read the first only.
        if old in out:
            found = out.pop(old)
            out.setdefault(name, found)
    return out
