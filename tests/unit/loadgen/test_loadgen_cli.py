"""`infertune bench` from the command line: profile files, overrides, table, JSON, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from loadgen_helpers import ServerFactory

from infertune.tuner.loadgen.cli import bench_main

SPEC = """
model: {uri: "builtin://tiny"}
slo:
  ttft: {max: 500ms, percentile: p95}
  itl: {max: 100ms}
traffic:
  concurrency: 4
  numRequests: 20
  warmupRequests: 2
  promptTokens: {mean: 16}
  outputTokens: {mean: 5}
"""

MANIFEST = """
apiVersion: infertune.dev/v1alpha1
kind: InferenceService
metadata: {name: chat}
spec:
  model: {uri: "builtin://tiny"}
  slo:
    e2e: {max: 2s, percentile: p99}
  traffic:
    rate: 30
    arrival: gamma
    burstiness: 0.5
    duration: 1s
    outputTokens: {mean: 3}
  hardware: {gpusPerReplica: 1}
"""


def test_bench_with_a_spec_prints_a_table_and_writes_json(
    scripted_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = scripted_server([5.0], [2.0])
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "out.json"
    rc = bench_main(["--url", url, "--profile", str(spec), "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "closed loop, 4 in flight" in text
    assert "ttft p95 <= 500ms" in text and "-> met" in text
    data = json.loads(out.read_text())
    assert data["completed"] == 20 and data["failed"] == 0
    assert data["ttft"]["p50"] > 4.0 and data["slo_met"] == {"ttft": True, "itl": True}


def test_bench_reads_an_inference_service_manifest(
    scripted_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = scripted_server([1.0], [1.0])
    spec = tmp_path / "isvc.yaml"
    spec.write_text(MANIFEST)
    rc = bench_main(["--url", url, "--profile", str(spec), "--json", "-"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert data["mode"] == "open" and data["rate"] == 30
    assert data["completed"] > 10 and "e2e" in data["slo_met"]


def test_flags_override_the_profile(
    scripted_server: ServerFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = scripted_server()
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    rc = bench_main(
        [
            "--url",
            url,
            "--profile",
            str(spec),
            "--rate",
            "50",
            "--num-requests",
            "7",
            "--output-tokens",
            "2",
            "--json",
            "-",
        ]
    )
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert (data["mode"], data["concurrency"], data["sent"]) == ("open", None, 7)
    assert data["itl"]["count"] == 7


def test_ramp_finds_a_rate(
    scripted_server: ServerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    url = scripted_server([2.0], [1.0])
    rc = bench_main(
        [
            "--url",
            url,
            "--ramp",
            "10:40:2:1",
            "--duration",
            "1s",
            "--output-tokens",
            "2",
            "--warmup",
            "0",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "highest rate meeting the SLOs: 40.00 req/s" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "5"], "set --duration or --num-requests"),
        (["--num-requests", "3"], "set rate"),
        (
            ["--rate", "5", "--num-requests", "3", "--arrival", "poisson", "--burstiness", "-1"],
            "burstiness",
        ),
        (["--rate", "5", "--num-requests", "3", "--ramp", "5"], "START:MAX"),
        (["--profile", "/nonexistent.yaml", "--num-requests", "3"], "cannot read file"),
    ],
)
def test_bad_input_is_a_usage_error_that_names_the_field(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = bench_main(["--url", "http://127.0.0.1:1", *argv])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_unreachable_server_still_reports(capsys: pytest.CaptureFixture[str]) -> None:
    rc = bench_main(
        ["--url", "http://127.0.0.1:1", "--model", "m", "--rate", "20", "--num-requests", "4"]
    )
    out = capsys.readouterr().out
    assert rc == 1  # nothing completed
    assert "4 x connection refused" in out


def test_progress_bar_draws_one_updating_line() -> None:
    import io

    from infertune.tuner.api import TrafficProfile
    from infertune.tuner.loadgen.cli import ProgressBar
    from infertune.tuner.loadgen.client import RequestRecord
    from infertune.tuner.loadgen.stats import summarize

    rec = RequestRecord(0, 8, 2, start=0.0, end=0.05, ttft=0.02, chunks=2, itl=[0.03])
    snap = summarize(
        [rec], slo=None, mode="closed", rate=None, concurrency=1, started=0.0, finished=0.05,
        dispatch_end=0.05, in_flight=[], prompt_length_exact=False, final=False,
    )  # fmt: skip
    out = io.StringIO()
    bar = ProgressBar(out, TrafficProfile.model_validate({"concurrency": 1, "numRequests": 4}))
    bar(snap)
    bar.close()
    text = out.getvalue()
    assert text.startswith("\r[") and "25%" in text and "p50 TTFT 20.0 ms" in text
    assert text.endswith("\n")
