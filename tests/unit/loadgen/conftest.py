"""Fixtures for the load generator: the scripted ground-truth server (a real HTTP server in its own
process, so it has its own core and its timing does not depend on the client) and a tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loadgen_helpers import ServerFactory

from infertune.testing.scripted_server import start_process, stop_process


@pytest.fixture
def scripted_server() -> Iterator[ServerFactory]:
    """start(ttft_ms, itl_ms, tokenizer_dir=None, slots=None, cpu=None) -> base URL; stopped after
    the test."""
    procs: list[Any] = []

    def start(
        ttft_ms: list[float] | None = None,
        itl_ms: list[float] | None = None,
        tokenizer_dir: Path | None = None,
        slots: int | None = None,
        cpu: int | None = None,
    ) -> str:
        proc, port = start_process(
            ttft_ms or [0.0],
            itl_ms or [0.0],
            tokenizer_dir=tokenizer_dir,
            slots=slots,
            cpu=cpu,
            boost=True,
        )
        procs.append(proc)
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        stop_process(proc)


WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "people",
    "make",
    "time",
    "for",
    "water",
    "and",
    "words",
    "school",
    "house",
    "world",
    "mother",
    "father",
    "country",
    "night",
    "picture",
    "study",
    "children",
    "animals",
    "together",
    "something",
    "sometimes",
    "important",
    "different",
    "following",
    "sentence",
    "remember",
    "beautiful",
    "extraordinary",
]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE tokenizer that prepends BOS, like a Llama tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from infertune.tuner.loadgen.prompts import _WORDS

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,  # small: many words stay several tokens, so exactness is really tested
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 3)] + [" ".join(WORDS)]
    tok.train_from_iterator(corpus * 4, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)]
    )
    out = tmp_path_factory.mktemp("tok")
    tok.save(str(out / "tokenizer.json"))
    return out
