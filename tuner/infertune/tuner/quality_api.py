"""Scoring token sequences through an engine's OpenAI API: what quality.py compares.

Two ways to ask, chosen by what the engine answers:

* **echo** (the built-in engine, vLLM, SGLang): one ``/v1/completions`` request per sequence with
  ``echo: true``, ``max_tokens: 0``, ``logprobs: k`` and ``return_tokens_as_token_ids: true``
  (vLLM 0.32's CompletionRequest: echo without generation returns the prompt's log-probabilities,
  its top-k keyed ``token_id:N`` so two ids that decode alike stay apart).
* **stepwise** (llama-server, which ignores ``echo`` and returns log-probabilities of generated
  tokens only, in its ``logprobs.content`` form): one request per position with the sequence up
  to it as the prompt, ``max_tokens: 1``, ``logprobs: k`` and ``logit_bias`` forcing the
  sequence's next token. llama-server reports the raw (pre-sampler) log-probabilities, so the
  forced token's ``logprob`` is the model's, and its prompt cache makes each request a
  one-token step (the previous request cached exactly this prefix).

Token ids come from the checkpoint's tokenizer.json (no weights): every engine scores the same ids.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from infertune.tuner.quality import TOP_K

FORCE_BIAS = 100.0  # a logit bias no other token overcomes


class ScoringError(RuntimeError):
    """The engine's answer has no usable log-probabilities; the message says what came back."""


@dataclass
class Scored:
    """One sequence scored from position 1: the top-k at each position (the scored token
    included) and the log-probability of the token that is actually there."""

    top: list[dict[int, float]] = field(default_factory=list)
    actual: list[float] = field(default_factory=list)


class ApiScorer:
    """Greedy continuations and teacher-forced scores from one engine's /v1/completions."""

    def __init__(self, url: str, model: str, *, k: int = TOP_K, timeout: float = 120.0) -> None:
        parsed = urlparse(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.model, self.k, self.timeout = model, k, timeout
        self.method: str | None = None  # echo or stepwise, learned on the first score()
        self._conn: http.client.HTTPConnection | None = None

    # ---- HTTP ---------------------------------------------------------------------------------
    def _post(self, body: dict[str, Any]) -> tuple[int, Any]:
        payload = json.dumps({"model": self.model, **body}).encode()
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self._conn.request(
                    "POST", "/v1/completions", payload, {"Content-Type": "application/json"}
                )
                resp = self._conn.getresponse()
                raw = resp.read()
            except (http.client.HTTPException, OSError) as exc:
                self.close()
                if attempt:
                    raise ScoringError(f"no answer from the engine: {exc!r}") from exc
                continue
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw.decode(errors="replace")[:300]
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- generation ---------------------------------------------------------------------------
    def continue_greedy(self, prompt: list[int], tokens: int) -> list[int]:
        """The engine's greedy continuation of `prompt` (token ids), up to `tokens` long."""
        status, body = self._post(
            {
                "prompt": prompt,
                "max_tokens": tokens,
                "temperature": 0,
                "logprobs": 1,
                "return_tokens_as_token_ids": True,
            }
        )
        choice = _choice(status, body)
        ids = [_entry_id(e) for e in _generated(choice)]
        if not ids:
            raise ScoringError(f"no generated token ids in {str(choice)[:300]}")
        return ids

    # ---- scoring ------------------------------------------------------------------------------
    def score(self, ids: list[int]) -> Scored:
        """Teacher-forced top-k and actual log-probabilities at positions 1..len(ids)-1."""
        if self.method != "stepwise":
            scored = self._score_echo(ids)
            if scored is not None:
                self.method = "echo"
                return scored
            if self.method == "echo":
                raise ScoringError("the engine stopped answering echo requests with logprobs")
            self.method = "stepwise"
        return self._score_stepwise(ids)

    def _score_echo(self, ids: list[int]) -> Scored | None:
        status, body = self._post(
            {
                "prompt": ids,
                "max_tokens": 0,
                "echo": True,
                "logprobs": self.k,
                "temperature": 0,
                "return_tokens_as_token_ids": True,
            }
        )
        if status != 200:
            return None  # e.g. an engine that refuses max_tokens 0: ask it stepwise
        lp = _choice(status, body).get("logprobs") or {}
        tokens, values, tops = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
        if not isinstance(tokens, list) or len(tokens) < len(ids) or not tops or not values:
            return None  # no prompt log-probabilities (llama-server's content form)
        out = Scored()
        for p in range(1, len(ids)):
            top = {_key_id(key): float(v) for key, v in (tops[p] or {}).items()}
            actual = values[p]
            if actual is None:
                raise ScoringError(f"no log-probability for prompt position {p}")
            top.setdefault(ids[p], float(actual))
            out.top.append(top)
            out.actual.append(float(actual))
        return out

    def _score_stepwise(self, ids: list[int]) -> Scored:
        out = Scored()
        for p in range(1, len(ids)):
            status, body = self._post(
                {
                    "prompt": ids[:p],
                    "max_tokens": 1,
                    "temperature": 0,
                    "logprobs": self.k,
                    "logit_bias": {str(ids[p]): FORCE_BIAS},
                    "return_tokens_as_token_ids": True,
                }
            )
            entries = _generated(_choice(status, body))
            if not entries or _entry_id(entries[0]) != ids[p]:
                raise ScoringError(f"position {p}: the engine did not take the forced token")
            first = entries[0]
            top = {_entry_id(t): float(t["logprob"]) for t in first.get("top_logprobs", [])}
            top.setdefault(ids[p], float(first["logprob"]))
            out.top.append(top)
            out.actual.append(float(first["logprob"]))
        return out


def wait_ready(scorer: ApiScorer, deadline_s: float = 60.0) -> None:
    """Until a one-token request succeeds (an engine may answer /health before its first step)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            status, body = scorer._post({"prompt": [0], "max_tokens": 1, "temperature": 0})
            if status == 200:
                return
            why = str(body)[:200]
        except OSError as exc:
            why = str(exc)
        if time.monotonic() > end:
            raise ScoringError(f"the engine did not answer a completion: {why}")
        time.sleep(0.5)


def _choice(status: int, body: Any) -> dict[str, Any]:
    if status != 200 or not isinstance(body, dict) or not body.get("choices"):
        raise ScoringError(f"HTTP {status}: {str(body)[:300]}")
    choice = body["choices"][0]
    if not isinstance(choice, dict):
        raise ScoringError(f"unexpected choice {str(choice)[:200]}")
    return choice


def _generated(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """The generated tokens' entries as {id, logprob, top_logprobs: [{id, logprob}]}: from the
    OpenAI completions form (token_id:N keys) or llama-server's ``content`` form."""
    lp = choice.get("logprobs") or {}
    if isinstance(lp.get("content"), list):
        return list(lp["content"])
    tokens, values, tops = (
        lp.get("tokens") or [],
        lp.get("token_logprobs") or [],
        lp.get("top_logprobs") or [],
    )
    return [
        {
            "token": t,
            "logprob": v,
            "top_logprobs": [{"token": key, "logprob": x} for key, x in (top or {}).items()],
        }
        for t, v, top in zip(tokens, values, tops, strict=False)
    ]


def _entry_id(entry: dict[str, Any]) -> int:
    if isinstance(entry.get("id"), int):
        return int(entry["id"])
    return _key_id(str(entry.get("token", "")))


def _key_id(key: str) -> int:
    if not key.startswith("token_id:"):
        raise ScoringError(f"token {key!r} is not a token_id:N key (return_tokens_as_token_ids)")
    return int(key.removeprefix("token_id:"))


def tokenizer_ids(model_dir: Path, texts: list[str], limit: int) -> list[list[int]]:
    """Token ids of `texts` by the checkpoint's own tokenizer.json, each cut to `limit`."""
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.exists():
        raise ScoringError(f"no tokenizer.json in {model_dir}: the guard scores token ids")
    tok = Tokenizer.from_file(str(path))
    return [tok.encode(t).ids[:limit] or [0] for t in texts]
