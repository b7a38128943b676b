"""A trial times /health while its load runs (HealthWatch), and the summary carries that latency
and the start-up time to the operator, which times its probes by them."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from infertune.operator.summary import parse_summary
from infertune.tuner.process import HealthWatch
from infertune.tuner.result import TrialRecord, _serving
from infertune.tuner.trial import HEALTH_KEY


class _Slow(BaseHTTPRequestHandler):
    delay_s = 0.2

    def do_GET(self) -> None:
        time.sleep(self.delay_s)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_health_watch_records_the_slowest_round_trip() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with HealthWatch(f"http://127.0.0.1:{server.server_port}/health", interval_s=0.05) as w:
            time.sleep(0.6)
        assert w.samples_ms and w.worst_ms is not None and 200 <= w.worst_ms < 2000
    finally:
        server.shutdown()


def test_a_dead_endpoint_counts_and_never_hangs() -> None:
    with HealthWatch("http://127.0.0.1:9/health", interval_s=0.05, timeout_s=0.5) as w:
        time.sleep(0.2)
    assert w.worst_ms is not None and w.worst_ms < 1000


def test_summary_carries_startup_and_health_latency_to_the_status() -> None:
    best = TrialRecord(
        number=0,
        config={"engine": "builtin", "quantization": "int8", "max_num_seqs": 8,
                "max_num_batched_tokens": 512, "kv_block_size": 16, "cuda_graph": False},
        outcome="ok", feasible=True, objective=1.0,
        figures={"ttftP95Ms": 12.0, HEALTH_KEY: 1234.56}, startup_s=42.123,
    )  # fmt: skip
    wire = _serving(best)
    assert wire["startupS"] == 42.12 and wire["healthLatencyMs"] == 1234.6
    assert HEALTH_KEY not in wire.get("measured", {})
    import json

    summary = parse_summary(json.dumps({"version": 1, "status": "succeeded", "best": wire}))
    assert not isinstance(summary, str)
    config = summary.serving_config()
    assert config is not None and config.startup_s == 42.12 and config.health_latency_ms == 1234.6
