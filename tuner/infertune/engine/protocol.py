"""OpenAI request parsing, chat prompts by the model's template, and incremental detokenization
(no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from infertune.engine.chat_template import ChatTemplate, ChatTemplateError
from infertune.engine.step import SamplingParams

__all__ = [
    "BadRequestError",
    "GenerationRequest",
    "IncrementalDetokenizer",
    "apply_chat_template",
    "parse_request",
]

DEFAULT_MAX_TOKENS = 16


class BadRequestError(ValueError):
    """A request body the server answers with 400; the message names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    max_tokens: int | None  # None: up to the context length
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    model: str | None = None
    # OpenAI completions: top-k log-probabilities per token (None: not asked), the prompt echoed
    # (with its log-probabilities when asked), and vLLM's token_id:N keys instead of token text.
    logprobs: int | None = None
    echo: bool = False
    tokens_as_ids: bool = False


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequestError(f"{key} must be a number, got {value!r}", key)
    if not low <= value <= high:
        raise BadRequestError(f"{key}={value} must be between {low} and {high}", key)
    return float(value)


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequestError(f"{key} must be true or false, got {value!r}", key)
    return value


def apply_chat_template(messages: Any, template: ChatTemplate | None) -> str:
    """The prompt text of a chat: ``messages`` (validated; content-part lists joined into their
    text) rendered by the checkpoint's own template with the assistant's turn opened."""
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("messages must be a non-empty list of {role, content}", "messages")
    conversation = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequestError(f"messages[{i}] must be an object with a role", "messages")
        content = m.get("content", "")
        if isinstance(content, list):  # the content-parts form: keep the text parts
            content = "".join(
                p.get("text", "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        if content is None:  # an assistant turn with only tool calls
            content = ""
        if not isinstance(content, str):
            raise BadRequestError(f"messages[{i}].content must be a string", "messages")
        conversation.append({**m, "content": content})
    if template is None:  # as vLLM: no template, no chat (a guessed format would mislead)
        raise BadRequestError(
            "this model has no chat template (chat_template.jinja or tokenizer_config.json's "
            "chat_template); use /v1/completions with a prompt",
            "messages",
        )
    try:
        return template.render(conversation, add_generation_prompt=True)
    except ChatTemplateError as exc:
        raise BadRequestError(str(exc), "messages") from exc


def parse_request(
    body: Any, tokenizer: Tokenizer, *, chat: bool, template: ChatTemplate | None = None
) -> GenerationRequest:
    """Validate a ``/v1/completions`` or ``/v1/chat/completions`` body (a chat's prompt is
    ``template``'s rendering, tokenized without added special tokens, as vLLM does)."""
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    if body.get("n", 1) != 1:
        raise BadRequestError("only n=1 is supported", "n")
    if chat:
        text = apply_chat_template(body.get("messages"), template)
        prompt_ids = list(tokenizer.encode(text, add_special_tokens=False).ids)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            prompt_ids = list(tokenizer.encode(prompt).ids)
        elif isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            vocab = tokenizer.get_vocab_size()
            if any(not 0 <= t < vocab for t in prompt):
                raise BadRequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
            prompt_ids = list(prompt)
        else:
            raise BadRequestError(
                "prompt must be a string or a list of token ids (one prompt per request)", "prompt"
            )
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is None and not chat:
        max_tokens = DEFAULT_MAX_TOKENS  # OpenAI's completions default
    echo = False if chat else _flag(body, "echo")
    least = 0 if echo else 1  # echo with max_tokens 0: the prompt (and its logprobs) only
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < least
    ):
        raise BadRequestError(
            f"{key} must be an integer of at least {least}, got {max_tokens!r}", key
        )
    logprobs = _logprobs(body, chat)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequestError(f"seed must be an integer, got {seed!r}", "seed")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequestError("stop must be a non-empty string or a list of them", "stop")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequestError("stream_options must be an object", "stream_options")
    model = body.get("model")
    return GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        sampling=SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
            seed=seed,
        ),
        stream=_flag(body, "stream"),
        include_usage=bool(options.get("include_usage", False)),
        ignore_eos=_flag(body, "ignore_eos"),
        stop=stop,
        model=model if isinstance(model, str) else None,
        logprobs=logprobs,
        echo=echo,
        tokens_as_ids=_flag(body, "return_tokens_as_token_ids"),
    )


MAX_LOGPROBS = 1000  # top-k per token; vLLM's default cap is 20, a scorer may want more


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """Completions: ``logprobs: k``. Chat: ``logprobs: true`` with ``top_logprobs: k``."""
    if chat:
        if not _flag(body, "logprobs"):
            if body.get("top_logprobs") is not None:
                raise BadRequestError("top_logprobs needs logprobs: true", "top_logprobs")
            return None
        key, value = "top_logprobs", body.get("top_logprobs", 0)
    else:
        key, value = "logprobs", body.get("logprobs")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise BadRequestError(
            f"{key} must be an integer between 0 and {MAX_LOGPROBS}, got {value!r}", key
        )
    return value


class IncrementalDetokenizer:
    """Text deltas for a growing list of token ids (vLLM's prefix/read-offset method).

    Decoding a window that starts a few tokens back keeps SentencePiece's leading-space rule
    and multi-byte characters right; a delta ending in U+FFFD is an incomplete UTF-8 sequence
    and is held back until the next token completes it.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_ids: list[int]) -> str:
        self.ids.extend(token_ids)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (e.g. a truncated UTF-8 sequence at the very end)."""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""
