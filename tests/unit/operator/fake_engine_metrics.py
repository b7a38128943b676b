"""An engine's latency metrics the way vLLM (and the built-in engine) expose them, fed by hand."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from infertune.operator.histograms import E2E, ITL, OUTPUT, PROMPT, REQUEST_TPOT, TTFT

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048)


class FakeEngine:
    """An engine's metrics the way vLLM (and the builtin engine) expose them."""

    def __init__(
        self,
        itl_names: tuple[str, ...] = (ITL,),
        buckets: tuple[float, ...] = BUCKETS,
        names: Mapping[str, str] | None = None,
    ) -> None:
        """`names`: family -> the name this engine exports it under (e.g. SGLANG_NAMES)."""
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        rename = dict(names or {})

        def hist(family: str, doc: str, bounds: tuple[float, ...]) -> Histogram:
            name = rename.get(family, family)
            return Histogram(name, doc, labels, buckets=bounds, registry=self.registry)

        self.ttft = hist(TTFT, "ttft", buckets)
        self.itls = [hist(name, "itl", buckets) for name in itl_names]
        self.tpot = hist(REQUEST_TPOT, "tpot", buckets)
        self.e2e = hist(E2E, "e2e", buckets)
        self.prompt = hist(PROMPT, "prompt", TOKENS)
        self.output = hist(OUTPUT, "output", TOKENS)

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
