"""The library entry point: bounds, warm-up, closed/open loop, early stop, saturation, chat API."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from loadgen_helpers import ServerFactory, server_log

from infertune.tuner.api import SLO, TrafficProfile
from infertune.tuner.loadgen import LoadResult, Options, run_load, run_load_sync


def _traffic(**body: object) -> TrafficProfile:
    body.setdefault("promptTokens", {"mean": 8})
    body.setdefault("outputTokens", {"mean": 4})
    return TrafficProfile.model_validate(body)


def test_warmup_requests_are_sent_but_not_measured(scripted_server: ServerFactory) -> None:
    url = scripted_server([2.0], [1.0])
    result = run_load_sync(
        url, _traffic(concurrency=2, numRequests=10, warmupRequests=5), model="scripted"
    )
    assert result.sent == 10 and result.completed == 10
    assert len(server_log(url)) == 15
    assert [r.index for r in result.records] == list(range(5, 15))


def test_duration_bound_stops_sending(scripted_server: ServerFactory) -> None:
    url = scripted_server([1.0], [1.0])
    t0 = time.perf_counter()
    result = run_load_sync(
        url, _traffic(rate=40.0, arrival="constant", duration="1s", warmupRequests=0), model="m"
    )
    assert time.perf_counter() - t0 < 10
    assert result.sent == 40  # offsets 0, 1/40, ..., 39/40 fall inside one second
    assert result.failed == 0


def test_a_profile_without_a_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="duration or numRequests"):
        run_load_sync("http://127.0.0.1:1", _traffic(rate=1.0), model="m")


def test_concurrency_caps_open_loop_in_flight(scripted_server: ServerFactory) -> None:
    url = scripted_server([50.0], [1.0])
    result = run_load_sync(
        url, _traffic(rate=500.0, concurrency=3, numRequests=30, warmupRequests=0), model="m"
    )
    assert result.completed == 30
    # When any request starts, at most two others are still in flight.
    recs = result.records
    overlap = [sum(1 for o in recs if o is not r and o.start <= r.start < o.end) for r in recs]
    assert max(overlap) == 2


def test_chat_api_is_measured_too(scripted_server: ServerFactory) -> None:
    url = scripted_server([3.0], [2.0])
    result = run_load_sync(
        url,
        _traffic(concurrency=2, numRequests=6, warmupRequests=0),
        model="m",
        options=Options(api="chat"),
    )
    assert result.completed == 6 and result.itl.count == 6 * 3


def test_model_name_comes_from_the_server_when_not_given(scripted_server: ServerFactory) -> None:
    url = scripted_server()
    result = run_load_sync(url, _traffic(concurrency=1, numRequests=2, warmupRequests=0))
    assert result.completed == 2


def test_should_stop_ends_the_run_early_with_intermediate_results(
    scripted_server: ServerFactory,
) -> None:
    url = scripted_server([5.0], [5.0])
    seen: list[LoadResult] = []

    def stop(snap: LoadResult) -> bool:
        seen.append(snap)
        return snap.completed >= 5

    t0 = time.perf_counter()
    result = run_load_sync(
        url,
        _traffic(concurrency=4, numRequests=100_000, warmupRequests=0),
        model="m",
        options=Options(progress_interval=0.2),
        on_progress=lambda snap: None,
        should_stop=stop,
    )
    assert time.perf_counter() - t0 < 30
    assert result.stopped_early and result.final
    assert not seen[0].final and seen[0].ttft.p50 is not None
    assert 5 <= result.completed < 100_000
    assert result.failed == 0  # requests cut short by the stop are not counted as failures


def test_cancelling_the_task_cancels_the_run(scripted_server: ServerFactory) -> None:
    url = scripted_server([5.0], [5.0])

    async def main() -> None:
        task = asyncio.ensure_future(
            run_load(url, _traffic(concurrency=4, numRequests=100_000, warmupRequests=0), model="m")
        )
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_overload_is_flagged_as_saturation(scripted_server: ServerFactory) -> None:
    """A server that takes 1 s per request under an open loop of 40 req/s with at most 5 in flight
    cannot keep up: completions fall behind and the backlog grows."""
    url = scripted_server([1000.0], [1.0])
    result = run_load_sync(
        url,
        _traffic(rate=40.0, concurrency=5, duration="2s", warmupRequests=0, arrival="constant"),
        SLO.model_validate({"e2e": {"max": "5s"}}),
        model="m",
    )
    assert result.saturation.saturated
    assert result.saturation.achieved_rate < 10


def test_a_server_that_keeps_up_is_not_saturated(scripted_server: ServerFactory) -> None:
    url = scripted_server([20.0, 60.0], [2.0])
    result = run_load_sync(url, _traffic(rate=50.0, duration="2s", warmupRequests=0), model="m")
    assert not result.saturation.saturated, result.saturation.reasons
    assert result.saturation.achieved_rate == pytest.approx(
        result.saturation.dispatched_rate, rel=0.15
    )


def test_replay_file_sets_each_request_length(
    scripted_server: ServerFactory, tmp_path: Path
) -> None:
    url = scripted_server()
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"prompt_tokens": 5, "output_tokens": 2}\n{"prompt_tokens": 9, "output_tokens": 6}\n'
    )
    result = run_load_sync(
        url,
        _traffic(concurrency=1, numRequests=4, warmupRequests=0, replayFile=str(trace)),
        model="m",
    )
    assert [(r.prompt_tokens, r.output_tokens) for r in result.records] == [(5, 2), (9, 6)] * 2
