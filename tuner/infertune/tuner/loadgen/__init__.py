"""SLO-aware load generator for OpenAI-compatible servers (`infertune bench`, and the tuner's probe).

One call for the tuner: `await run_load(url, traffic, slo, model=...)` (or `run_load_sync`) returns
a LoadResult with TTFT/ITL/TPOT/e2e percentiles, throughput, goodput, SLO attainment and saturation.
`find_max_rate` sweeps rates for the highest one that still meets the SLOs (goodput search).
"""

from infertune.tuner.loadgen.client import RequestRecord
from infertune.tuner.loadgen.endpoint import Endpoint
from infertune.tuner.loadgen.ramp import RampResult, RampSpec, find_max_rate
from infertune.tuner.loadgen.runner import Options, run_load, run_load_sync
from infertune.tuner.loadgen.stats import LoadResult, Saturation, Summary

__all__ = [
    "Endpoint",
    "LoadResult",
    "Options",
    "RampResult",
    "RampSpec",
    "RequestRecord",
    "Saturation",
    "Summary",
    "find_max_rate",
    "run_load",
    "run_load_sync",
]
