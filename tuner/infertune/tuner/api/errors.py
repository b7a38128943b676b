"""Turn pydantic's errors into messages an SRE can act on: field path, bad value, what is allowed."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith("function-") or part in ("list", "dict"):
            continue  # pydantic's internal step names, not fields
        else:
            out = f"{out}.{part}" if out else part
    return out or "(root)"


def _fields_of(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The wire names a model accepts at the parent of `loc` (for 'unknown field' hints)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue
        field = next(
            (f for n, f in current.model_fields.items() if part in (n, f.alias)),
            None,
        )
        if field is None:
            return []
        current = _model_in(field.annotation)
    if current is None:
        return []
    return [f.alias or n for n, f in current.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe_errors(exc: ValidationError, model: type[BaseModel], prefix: str = "") -> list[str]:
    """One line per problem, every problem (not only the first)."""
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = _path(prefix, loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            allowed = _fields_of(model, loc)
            name = str(loc[-1])
            hint = difflib.get_close_matches(name, allowed, n=1)
            did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
            lines.append(
                f"{path}: unknown field{did_you_mean}; allowed fields here: {', '.join(allowed)}"
            )
        elif kind == "missing":
            lines.append(f"{path}: required field is missing")
        elif kind == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            lines.append(
                f"{path}: {_short(err['input'])} is not allowed; allowed values: {expected}"
            )
        else:
            msg = err["msg"].removeprefix("Value error, ")
            shown = "" if kind == "value_error" and not loc else f" (got {_short(err['input'])})"
            if isinstance(err["input"], dict) or _short(err["input"]) in msg:
                shown = ""
            lines.append(f"{path}: {msg}{shown}")
    return lines
