"""The library entry point: run a traffic profile against a URL and return a LoadResult.

Open loop when the profile has a `rate` (requests leave on the arrival process's schedule whether or
not earlier ones finished; with `concurrency` too, at most that many are in flight), closed loop
when it has only `concurrency`. Warm-up requests go first and are not measured. A progress callback
receives intermediate results, and `should_stop` can end the run early (an Optuna pruner does).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from infertune.tuner.api import SLO, TrafficProfile
from infertune.tuner.loadgen.arrivals import arrival_offsets
from infertune.tuner.loadgen.client import CANCELLED, Client, RequestRecord
from infertune.tuner.loadgen.endpoint import Api, Endpoint, encode_request, fetch_json
from infertune.tuner.loadgen.endpoint import request_body as make_body
from infertune.tuner.loadgen.lengths import iter_lengths, read_replay
from infertune.tuner.loadgen.prompts import PromptFactory, load_tokenizer
from infertune.tuner.loadgen.stats import LoadResult, summarize

T = TypeVar("T")
ProgressFn = Callable[[LoadResult], None]
StopFn = Callable[[LoadResult], bool]
_SAMPLE_INTERVAL = 0.1  # seconds between in-flight samples (saturation detection)


@dataclass(slots=True)
class Options:
    """How to talk to the server; defaults suit vLLM, SGLang and llama.cpp."""

    api: Api = "completions"
    ignore_eos: bool = True
    timeout: float = 600.0
    api_key: str | None = None
    seed: int | None = 0
    progress_interval: float = 1.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    # Time each chunk by when it reached this host (the kernel's receive stamp) rather than when
    # the generator read it. Off by default: peer tools (vllm bench serve) time on read, and on
    # a starved host the two differ by the generator's own lateness (2-3 ms p50 beside a vLLM
    # CPU engine here; benchmarks/bench_loadgen_accuracy.py).
    kernel_timestamps: bool = False


async def resolve_model(endpoint: Endpoint) -> str:
    """The first model the server lists at /v1/models."""
    try:
        listing = await fetch_json(endpoint, "/v1/models")
        return str(listing["data"][0]["id"])
    except (OSError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ValueError(
            f"cannot find the served model name at {endpoint.host}:{endpoint.port}/v1/models "
            f"({exc}); pass --model NAME"
        ) from exc


class _Run:
    """State of one measured run: the request plan, in-flight bookkeeping, stop signal."""

    def __init__(
        self,
        client: Client,
        plan: Iterator[tuple[RequestRecord, bytes]],
        traffic: TrafficProfile,
        slo: SLO | None,
        exact: bool,
    ) -> None:
        self.client = client
        self.plan = plan
        self.traffic = traffic
        self.slo = slo
        self.exact = exact
        self.records: list[RequestRecord] = []
        self.tasks: set[asyncio.Task[RequestRecord]] = set()
        self.in_flight = 0
        self.samples: list[tuple[float, int]] = []
        self.stop = asyncio.Event()
        self.stopped_early = False
        self.started = 0.0
        self.dispatch_end = 0.0
        self.slot = asyncio.Event()  # set whenever a request finishes (concurrency cap)
        self.seed: int | None = 0

    @property
    def mode(self) -> str:
        return "open" if self.traffic.rate is not None else "closed"

    def budget_left(self, now: float | None) -> bool:
        """Whether to send another request; `now` None leaves the duration to the caller (the
        open loop bounds it by arrival offsets, so a late dispatch is not dropped)."""
        t = self.traffic
        if self.stop.is_set():
            return False
        if t.num_requests is not None and len(self.records) >= t.num_requests:
            return False
        return t.duration is None or now is None or now - self.started < float(t.duration)

    async def _one(self, record: RequestRecord, payload: bytes) -> RequestRecord:
        try:
            return await self.client.send(record, payload)
        finally:
            self.in_flight -= 1
            self.slot.set()

    def dispatch(self, scheduled: float) -> asyncio.Task[RequestRecord]:
        record, payload = next(self.plan)
        record.scheduled = scheduled
        self.records.append(record)
        # Counted here, not when the task first runs: the dispatcher checks the cap before then.
        self.in_flight += 1
        task = asyncio.ensure_future(self._one(record, payload))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def open_loop(self) -> None:
        t = self.traffic
        assert t.rate is not None
        cap = t.concurrency
        for offset in arrival_offsets(t.arrival, t.rate, burstiness=t.burstiness, seed=self.seed):
            if t.duration is not None and offset >= t.duration:
                break
            due = self.started + offset
            # Arrivals already due go out together; otherwise sleep in short steps so that a
            # stop request is honoured quickly even at very low rates.
            while (now := time.perf_counter()) < due and not self.stop.is_set():
                await asyncio.sleep(min(due - now, _SAMPLE_INTERVAL))
            if cap is not None:
                while self.in_flight >= cap and not self.stop.is_set():
                    self.slot.clear()
                    await self.slot.wait()
                # Arrivals held back by the cap past the run's duration are not sent: the
                # duration bounds the run's length; the backlog is reported as saturation.
                if not self.budget_left(time.perf_counter()):
                    break
            if not self.budget_left(None):
                break
            self.dispatch(due)
        self.dispatch_end = time.perf_counter()

    async def closed_loop(self) -> None:
        concurrency = self.traffic.concurrency
        assert concurrency is not None

        async def worker() -> None:
            while self.budget_left(time.perf_counter()):
                # wait(), not await: a request cancelled by should_stop must not end the worker
                # with CancelledError.
                await asyncio.wait([self.dispatch(time.perf_counter())])

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        self.dispatch_end = time.perf_counter()

    def snapshot(self, *, final: bool) -> LoadResult:
        done = [r for r in self.records if r.end and r.error != CANCELLED]
        return summarize(
            done,
            slo=self.slo,
            mode=self.mode,
            rate=self.traffic.rate,
            concurrency=self.traffic.concurrency,
            started=self.started,
            finished=max((r.end for r in done), default=time.perf_counter()),
            dispatch_end=self.dispatch_end or time.perf_counter(),
            in_flight=self.samples,
            prompt_length_exact=self.exact,
            final=final,
            stopped_early=self.stopped_early,
        )

    async def monitor(
        self, interval: float, on_progress: ProgressFn | None, should_stop: StopFn | None
    ) -> None:
        next_report = time.perf_counter() + interval
        while True:
            await asyncio.sleep(_SAMPLE_INTERVAL)
            now = time.perf_counter()
            if not self.dispatch_end:
                self.samples.append((now - self.started, self.in_flight))
            if now < next_report or (on_progress is None and should_stop is None):
                continue
            next_report = now + interval
            snap = self.snapshot(final=False)
            if on_progress is not None:
                on_progress(snap)
            if should_stop is not None and should_stop(snap):
                self.stopped_early = True
                self.stop.set()
                self.slot.set()
                for task in list(self.tasks):
                    task.cancel()


def _plan(
    endpoint: Endpoint,
    traffic: TrafficProfile,
    prompts: PromptFactory,
    model: str,
    opts: Options,
) -> Iterator[tuple[RequestRecord, bytes]]:
    replay = read_replay(Path(traffic.replay_file)) if traffic.replay_file else None
    lengths = iter_lengths(
        traffic.prompt_tokens, traffic.output_tokens, replay=replay, seed=opts.seed
    )
    for index, pair in enumerate(lengths):
        body = make_body(
            endpoint,
            model,
            prompts.make(pair.prompt_tokens),
            pair.output_tokens,
            ignore_eos=opts.ignore_eos,
            extra=opts.extra_body,
        )
        yield (
            RequestRecord(index, pair.prompt_tokens, pair.output_tokens),
            encode_request(endpoint, body, opts.api_key),
        )


async def run_load(
    url: str,
    traffic: TrafficProfile,
    slo: SLO | None = None,
    *,
    model: str | None = None,
    tokenizer_dir: Path | None = None,
    options: Options | None = None,
    on_progress: ProgressFn | None = None,
    should_stop: StopFn | None = None,
) -> LoadResult:
    """Run `traffic` against the OpenAI-compatible server at `url`; never raises for request faults.

    Raises ValueError for an unusable profile (no bound, bad replay file, unknown tokenizer) or when
    `model` is None and the server cannot be asked for it.
    """
    opts = options or Options()
    if traffic.duration is None and traffic.num_requests is None:
        raise ValueError("traffic: set duration or numRequests (--duration / --num-requests)")
    endpoint = Endpoint.parse(url, opts.api)
    if model is None:
        model = await resolve_model(endpoint)
    tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir is not None else None
    prompts = PromptFactory(tokenizer, seed=opts.seed)
    plan = _plan(endpoint, traffic, prompts, model, opts)
    client = Client(
        endpoint,
        timeout=opts.timeout,
        api_key=opts.api_key,
        kernel_timestamps=opts.kernel_timestamps,
    )
    try:
        await _warm_up(client, plan, traffic)
        run = _Run(client, plan, traffic, slo, prompts.exact)
        run.seed = opts.seed
        # Objects that exist now (the plan, imported modules) never become garbage during the
        # run; moving them out of the collector's reach shortens the pauses that would otherwise
        # land in the middle of a stream and show up as inter-token latency.
        gc.collect()
        gc.freeze()
        run.started = time.perf_counter()
        monitor = asyncio.ensure_future(
            run.monitor(opts.progress_interval, on_progress, should_stop)
        )
        try:
            await (run.open_loop() if traffic.rate is not None else run.closed_loop())
            await _drain(run)
        except asyncio.CancelledError:
            for task in list(run.tasks):
                task.cancel()
            raise
        finally:
            gc.unfreeze()
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
        return run.snapshot(final=True)
    finally:
        await client.close()


async def _warm_up(
    client: Client, plan: Iterator[tuple[RequestRecord, bytes]], traffic: TrafficProfile
) -> None:
    n = traffic.warmup_requests
    if n <= 0:
        return
    width = min(n, traffic.concurrency or 4)
    items = [next(plan) for _ in range(n)]
    for i in range(0, n, width):
        await asyncio.gather(*(client.send(r, p) for r, p in items[i : i + width]))


async def _drain(run: _Run) -> None:
    while run.tasks:
        await asyncio.gather(*list(run.tasks), return_exceptions=True)


def run_load_sync(*args: Any, **kwargs: Any) -> LoadResult:
    """`run_load` on a fresh event loop, for callers outside asyncio."""
    return run_in_loop(run_load(*args, **kwargs))


def run_in_loop(coro: Coroutine[Any, Any, T]) -> T:
    # The standard loop: uvloop measured no faster here (the per-request cost is the parsing in
    # Python, not the loop), see benchmarks/bench_loadgen.py.
    return asyncio.run(coro)
