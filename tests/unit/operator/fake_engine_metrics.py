"""An engine's latency metrics the way vLLM (and the built-in engine) expose them, fed by hand."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from infertune.operator.histograms import E2E, ITL, OUTPUT, PROMPT, REQUEST_TPOT, TTFT

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048)


class FakeEngine:
    """An engine's metrics the way vLLM (and the builtin engine) expose them."""

    def __init__(
        self, itl_names: tuple[str, ...] = (ITL,), buckets: tuple[float, ...] = BUCKETS
    ) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.ttft = Histogram(TTFT, "ttft", labels, buckets=buckets, registry=self.registry)
        self.itls = [
            Histogram(name, "itl", labels, buckets=buckets, registry=self.registry)
            for name in itl_names
        ]
        self.tpot = Histogram(REQUEST_TPOT, "tpot", labels, buckets=buckets, registry=self.registry)
        self.e2e = Histogram(E2E, "e2e", labels, buckets=buckets, registry=self.registry)
        self.prompt = Histogram(PROMPT, "prompt", labels, buckets=TOKENS, registry=self.registry)
        self.output = Histogram(OUTPUT, "output", labels, buckets=TOKENS, registry=self.registry)

    def request(self, ttft: float, itl: float | list[float], prompt: int, output: int) -> None:
        gaps = itl if isinstance(itl, list) else [itl] * (output - 1)
        self.ttft.labels("m").observe(ttft)
        for gap in gaps:
            for hist in self.itls:
                hist.labels("m").observe(gap)
        if gaps:
            self.tpot.labels("m").observe(sum(gaps) / len(gaps))
        self.e2e.labels("m").observe(ttft + sum(gaps))
        self.prompt.labels("m").observe(prompt)
        self.output.labels("m").observe(output)

    def text(self) -> str:
        return generate_latest(self.registry).decode()
