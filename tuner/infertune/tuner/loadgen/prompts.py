"""Prompts of an exact token length for the model's tokenizer.

A "512-token prompt" must be 512 tokens on the server too (special tokens such as BOS included, as
the server's usage counts them), or TTFT comparisons across configurations mean nothing. Prompts are
random sequences of common words, different for every request so that a server's prefix cache does
not turn the benchmark into a cache benchmark. With the model's tokenizer.json every prompt is
checked by encoding it and adjusted until the count is exact; without one, one word is taken as one
token and the server's usage counts (recorded per request) tell how far off that was.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

_COMMON_WORDS = (
    "the of and to in is was for on are with as at be by this from that have or had not but "
    "what all were when we there can an your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know get through back much "
    "before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take "
    "why things help put years different away again off went old number great tell men say "
    "small every found still between name should home big give air line set own under read "
    "last never us left end along while might next sound below saw something thought both few "
    "those always looked show large often together asked house world going want school "
    "important until form food keep children feet land side without boy once animals life "
    "enough took sometimes four head above kind began almost live page got earth need far "
    "hand high year mother light parts country father let night following picture being study "
    "second eyes soon times story boys since white days ever paper hard near sentence better "
    "best"
)
_WORDS = tuple(_COMMON_WORDS.split())


def load_tokenizer(directory: Path) -> Any:
    """The `tokenizers.Tokenizer` in DIR/tokenizer.json; ValueError naming the path if absent."""
    from tokenizers import Tokenizer

    path = directory / "tokenizer.json" if directory.is_dir() else directory
    if not path.is_file():
        raise ValueError(f"--tokenizer {str(directory)!r}: no tokenizer.json there")
    return Tokenizer.from_file(str(path))


class PromptFactory:
    """Makes a fresh prompt of a requested token length for each request."""

    def __init__(self, tokenizer: Any | None = None, *, seed: int | None = None) -> None:
        self.tokenizer = tokenizer
        # The stdlib generator: per request it is several times cheaper than numpy's choice(),
        # and prompt building is on the generator's hot path at thousands of requests/s.
        self._rng = random.Random(seed)
        self._words = list(_WORDS) if tokenizer is None else self._single_token_words()
        # Tokens the tokenizer adds around any text (BOS/EOS); the server counts them too.
        self.special = 0
        if tokenizer is not None:
            with_special = len(tokenizer.encode("hello", add_special_tokens=True).ids)
            bare = tokenizer.encode("hello", add_special_tokens=False)
            self.special = with_special - len(bare.ids)

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def count(self, text: str) -> int:
        """Tokens the server will see for `text` (a word count without a tokenizer)."""
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def _single_token_words(self) -> list[str]:
        # Words that add exactly one token after another word: then n words are n tokens, and the
        # check below rarely needs to adjust anything.
        tok: Any = self.tokenizer

        def bare(text: str) -> int:
            return len(tok.encode(text, add_special_tokens=False).ids)

        base = bare("hello")
        words = [w for w in _WORDS if bare(f"hello {w}") == base + 1]
        return words if len(words) >= 16 else list(_WORDS)

    def _random_text(self, n_words: int) -> str:
        if n_words <= 0:
            return ""
        return " ".join(self._rng.choices(self._words, k=n_words))

    def make(self, n_tokens: int) -> str:
        """A prompt of exactly `n_tokens` tokens (with a tokenizer), else of `n_tokens` words."""
        if self.tokenizer is None:
            return self._random_text(max(1, n_tokens))
        target = max(0, n_tokens - self.special)
        for _attempt in range(8):
            text = self._random_text(target)
            for _step in range(12):
                have = self.count(text)
                if have == n_tokens:
                    return text
                text = self._adjust(text, n_tokens - have)
        raise ValueError(
            f"cannot build a prompt of exactly {n_tokens} tokens with this tokenizer "
            f"(it adds {self.special} special tokens to any text)"
        )

    def _adjust(self, text: str, delta: int) -> str:
        tok: Any = self.tokenizer
        if delta > 0:
            return f"{text} {self._random_text(delta)}" if text else self._random_text(delta)
        ids = tok.encode(text, add_special_tokens=False).ids
        return str(tok.decode(ids[: max(0, len(ids) + delta)]))
