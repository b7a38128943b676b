"""SLO-aware load generator for OpenAI-compatible servers (`infertune bench`, and the tuner's probe).

One call for the tuner: `await run_load(url, traffic, slo, model=...)` (or `run_load_sync`) returns
a LoadResult with TTFT/ITL/TPOT/e2e percentiles, throughput, goodput, SLO attainment and saturation.
"""

from infertune.tuner.loadgen.client import RequestRecord
from infertune.tuner.loadgen.endpoint import Endpoint
from infertune.tuner.loadgen.runner import Options, run_load, run_load_sync
from infertune.tuner.loadgen.stats import LoadResult, Saturation, Summary

__all__ = [
    "Endpoint",
    "LoadResult",
    "Options",
    "RequestRecord",
    "Saturation",
    "Summary",
    "run_load",
    "run_load_sync",
]
