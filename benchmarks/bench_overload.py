"""The built-in engine under twice its saturation rate: no crash, bounded memory, 503s, recovery.

1. ``infertune serve`` (tiny, fp32, ``--max-waiting 32``) is started; the load generator's ramp
   (:func:`find_max_rate`, open-loop Poisson steps, no SLO) finds the highest sustained rate.
2. A light phase (a quarter of that rate) gives the reference latency.
3. Overload: open-loop arrivals at twice the saturation rate for ``BENCH_OVERLOAD_SECONDS``
   (default 300); every answer is counted by status, 503s must carry ``Retry-After``, and the
   server's RSS is sampled from ``/proc`` every second.
4. The light phase again: the server must recover (no failures, TTFT p95 within 2x + 100 ms
   of the reference) and still be alive.

    .venv/bin/python benchmarks/bench_overload.py
    BENCH_OVERLOAD_SECONDS=30 .venv/bin/python benchmarks/bench_overload.py
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from infertune.engine.make_model import ensure_model
from infertune.tuner.api import TrafficProfile
from infertune.tuner.loadgen import LoadResult, Options, run_load_sync
from infertune.tuner.loadgen.ramp import RampSpec, find_max_rate

SECONDS = float(os.environ.get("BENCH_OVERLOAD_SECONDS", "300"))
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 32
MAX_WAITING = 8
LIGHT_SECONDS = "15s"


@contextlib.contextmanager
def server(model_dir: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    cmd = [sys.executable, "-m", "infertune.engine.cli", "serve", "--model", str(model_dir),
           "--port", "0", "--max-waiting", str(MAX_WAITING)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        if "ready on" not in line:
            raise RuntimeError(f"infertune serve did not start (exit {proc.poll()}): {line!r}")
        yield line.strip().rsplit(" ", 1)[1], proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def traffic(**extra: Any) -> TrafficProfile:
    return TrafficProfile.model_validate(
        {
            "promptTokens": {"mean": PROMPT_TOKENS},
            "outputTokens": {"mean": OUTPUT_TOKENS},
            "warmupRequests": 2,
            **extra,
        }
    )


def light(url: str, model_dir: Path, rate: float) -> LoadResult:
    profile = traffic(rate=rate, duration=LIGHT_SECONDS)
    opts = Options(extra_body={"temperature": 0.0})
    return run_load_sync(url, profile, model=model_dir.name, tokenizer_dir=model_dir, options=opts)


async def overload(url: str, model: str, rate: float, seconds: float) -> Counter[str]:
    """Poisson arrivals at ``rate`` for ``seconds``; answers counted by status."""
    counts: Counter[str] = Counter()
    body = {"model": model, "prompt": "word " * PROMPT_TOKENS, "max_tokens": OUTPUT_TOKENS,
            "ignore_eos": True, "temperature": 0.0}  # fmt: skip
    rng = random.Random(0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:

        async def one() -> None:
            try:
                async with session.post(f"{url}/v1/completions", json=body) as r:
                    await r.read()
                    if r.status == 503:
                        counts[
                            "503 with Retry-After" if r.headers.get("Retry-After") else "503"
                        ] += 1
                    else:
                        counts[str(r.status)] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                counts[f"error {type(exc).__name__}"] += 1

        tasks = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    return counts


def _row(name: str, value: Any, unit: str = "", note: str = "") -> dict[str, Any]:
    print(f"   {name}: {value} {unit} {note}", file=sys.stderr, flush=True)
    return {"name": name, "value": value, "unit": unit, "note": note}


def run() -> list[dict[str, Any]]:
    model_dir = ensure_model("tiny")
    rows: list[dict[str, Any]] = []
    with server(model_dir) as (url, proc):
        ramp = asyncio.run(
            find_max_rate(
                url,
                traffic(rate=1.0, duration="10s"),
                None,
                RampSpec(start=1.0, max_rate=256.0, factor=2.0, refine=2),
                model=model_dir.name,
                tokenizer_dir=model_dir,
                options=Options(extra_body={"temperature": 0.0}),
            )
        )
        sat = ramp.best_rate or 1.0
        rows.append(_row("saturation rate", round(sat, 2), "req/s", "load generator ramp"))
        before = light(url, model_dir, sat / 4)
        rss: list[float] = [rss_mib(proc.pid)]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(1.0):
                with contextlib.suppress(OSError):
                    rss.append(rss_mib(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        counts = asyncio.run(overload(url, model_dir.name, 2 * sat, SECONDS))
        elapsed = time.monotonic() - started
        stop.set()
        sampler.join()
        after = light(url, model_dir, sat / 4)
        alive = proc.poll() is None
    sent = sum(counts.values())
    ok = counts.get("200", 0)
    rejected = counts.get("503 with Retry-After", 0)
    other = sent - ok - rejected
    rows.append(_row("offered rate", round(2 * sat, 2), "req/s", f"2x saturation, {elapsed:.0f} s"))
    rows.append(_row("requests sent", sent))
    rows.append(_row("answered 200", ok, "", f"{ok / max(elapsed, 1e-9):.2f} req/s served"))
    rows.append(
        _row("rejected 503 + Retry-After", rejected, "", f"{100 * rejected / max(sent, 1):.0f}%")
    )
    rows.append(_row("other answers/errors", other, "", str(dict(counts))))
    growth = max(rss) - rss[0]
    rows.append(
        _row(
            "server RSS",
            round(max(rss), 1),
            "MiB",
            f"start {rss[0]:.0f}, end {rss[-1]:.0f}, "
            f"max growth {growth:.0f} MiB over {len(rss)} samples",
        )
    )
    limit = 2 * (before.ttft.p95 or 0) + 100
    recovered = alive and after.failed == 0 and (after.ttft.p95 or 1e9) <= limit
    rows.append(
        _row(
            "light TTFT p95 before/after",
            f"{before.ttft.p95 or 0:.0f}/{after.ttft.p95 or 0:.0f}",
            "ms",
            f"recovered={recovered} (alive={alive}, failed={after.failed}, limit {limit:.0f} ms)",
        )
    )
    verdict = alive and other == 0 and rejected > 0 and recovered and growth < 512
    rows.append(_row("overload verdict", "pass" if verdict else "FAIL", "", "no crash, 503s, "
                     "RSS growth < 512 MiB, recovery"))  # fmt: skip
    return rows


if __name__ == "__main__":
    for row in run():
        print(f"{row['name']:<32} {row['value']!s:>10} {row['unit']:<6} {row['note']}")
