"""Prompts of an exact token length: a "N-token prompt" is N tokens on the server too."""

from __future__ import annotations

from pathlib import Path

import pytest
from loadgen_helpers import ServerFactory

from infertune.tuner.api import TrafficProfile
from infertune.tuner.loadgen import run_load_sync
from infertune.tuner.loadgen.prompts import PromptFactory, load_tokenizer


@pytest.mark.parametrize("n", [1, 2, 3, 17, 64, 333, 1024])
def test_prompt_has_exactly_n_tokens_with_bos(tokenizer_dir: Path, n: int) -> None:
    tok = load_tokenizer(tokenizer_dir)
    factory = PromptFactory(tok, seed=n)
    assert factory.special == 1  # the BOS the template adds
    for _ in range(5):
        text = factory.make(n)
        assert len(tok.encode(text, add_special_tokens=True).ids) == n


def test_prompts_differ_between_requests(tokenizer_dir: Path) -> None:
    factory = PromptFactory(load_tokenizer(tokenizer_dir), seed=0)
    prompts = {factory.make(50) for _ in range(20)}
    assert len(prompts) == 20  # a prefix cache must not serve the benchmark


def test_missing_tokenizer_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)


def test_server_counts_the_requested_lengths(
    scripted_server: ServerFactory, tokenizer_dir: Path
) -> None:
    url = scripted_server(tokenizer_dir=tokenizer_dir)
    traffic = TrafficProfile.model_validate(
        {
            "concurrency": 4,
            "numRequests": 40,
            "warmupRequests": 0,
            "promptTokens": {"distribution": "uniform", "min": 5, "max": 300},
            "outputTokens": {"mean": 3},
        }
    )
    result = run_load_sync(url, traffic, model="scripted", tokenizer_dir=tokenizer_dir)
    assert result.prompt_length_exact
    assert result.completed == 40
    assert [r.prompt_tokens for r in result.records] == [r.prompt_len for r in result.records]
    assert len({r.prompt_len for r in result.records}) > 10
    assert result.prompt_tokens_server == pytest.approx(result.prompt_tokens_requested)


def test_without_a_tokenizer_the_server_count_is_reported(scripted_server: ServerFactory) -> None:
    url = scripted_server()  # counts words when it has no tokenizer
    traffic = TrafficProfile.model_validate(
        {"concurrency": 2, "numRequests": 6, "warmupRequests": 0, "promptTokens": {"mean": 40}}
    )
    result = run_load_sync(url, traffic, model="scripted")
    assert not result.prompt_length_exact
    assert result.prompt_tokens_server == 40
