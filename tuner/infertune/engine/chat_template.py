"""The checkpoint's own chat template, rendered as transformers and vLLM render it.

A chat request becomes a prompt by the model's Jinja template (ChatML for SmolLM2, ``<|role|>``
lines for the generated models), never by a fixed format: a model prompted in a format it was not
trained on answers worse. The template comes from ``chat_template.jinja`` (where transformers
>= 4.47 saves it), else ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of
``{name, template}`` whose ``default`` is used), as ``PreTrainedTokenizerBase`` loads it.

Rendering follows transformers' ``_compile_jinja_template``: a sandboxed environment with
``trim_blocks``/``lstrip_blocks``, the loop-controls extension, a ``tojson`` filter that keeps
non-ASCII text, ``raise_exception`` and ``strftime_now``, and the tokenizer's special tokens
(``bos_token``, ``eos_token``, ...) as variables. The result is tokenized without adding special
tokens (vLLM's chat default): the template writes them itself.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "ChatTemplateError", "load_chat_template"]

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


class ChatTemplateError(ValueError):
    """The template refused the conversation (its ``raise_exception``) or failed to render."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, **kwargs: Any
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)  # the server's local date, as transformers does


class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self._template = env.from_string(source)

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages`` (with the assistant's turn opened)."""
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template failed: {exc}") from exc


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes a special token as a string or as an AddedToken dict.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def load_chat_template(model_dir: Path | str) -> ChatTemplate | None:
    """The checkpoint's chat template, or None when it has none."""
    directory = Path(model_dir)
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}
    jinja = directory / "chat_template.jinja"
    source: Any = jinja.read_text(encoding="utf-8") if jinja.is_file() else None
    if source is None:
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        return None
    specials = {key: text for key in _SPECIAL_KEYS if (text := _token_text(config.get(key)))}
    return ChatTemplate(source, specials)
