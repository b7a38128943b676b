"""OpenAI's log-probability objects from the engine's :class:`~infertune.engine.step.TokenLogprob`.

Completions (the legacy format vLLM also answers with): ``tokens``, ``token_logprobs``,
``top_logprobs`` (one ``{token: logprob}`` per token, the token itself included, as vLLM does) and
``text_offset``; with ``echo`` the prompt comes first and its first token has ``None`` for both
(nothing precedes it). Chat: ``{"content": [{token, logprob, bytes, top_logprobs}]}``. With
``return_tokens_as_token_ids`` (vLLM's extension) a token is written ``token_id:N``, so two ids
that decode to the same text stay two keys. No torch here: the server process formats them.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from infertune.engine.step import TokenLogprob

__all__ = ["chat_logprobs", "completion_logprobs"]


class TokenText:
    """Token id -> the text a client sees for it (cached: the same ids recur)."""

    def __init__(self, tokenizer: Tokenizer, as_ids: bool) -> None:
        self.tokenizer, self.as_ids = tokenizer, as_ids
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = (
                f"token_id:{token_id}"
                if self.as_ids
                else self.tokenizer.decode([token_id], skip_special_tokens=False)
            )
            self._cache[token_id] = text
        return text


def completion_logprobs(
    ids: list[int],
    entries: list[TokenLogprob | None],
    text: TokenText,
    offset: int = 0,
) -> dict[str, Any]:
    """The completions ``logprobs`` object of tokens ``ids`` (``entries[i]`` is ``ids[i]``'s,
    None where nothing preceded it); ``offset``: the text offset of the first token."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    for token_id, entry in zip(ids, entries, strict=True):
        s = text(token_id)
        tokens.append(s)
        text_offset.append(offset)
        offset += len(s)
        if entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(entry.logprob)
        top = {text(t): lp for t, lp in entry.top}
        top.setdefault(s, entry.logprob)
        top_logprobs.append(top)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }


def chat_logprobs(entries: list[TokenLogprob], text: TokenText) -> dict[str, Any]:
    """The chat ``logprobs`` object (``{"content": [...]}``) of generated tokens."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        s = text(token_id)
        return {"token": s, "logprob": logprob, "bytes": list(s.encode())}

    return {
        "content": [
            {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
            for e in entries
        ]
    }
