"""Durations written the way Kubernetes users write them ("300ms", "2s", "1m30s").

Torch-free and Kubernetes-free: the tuner reads these from a plain YAML spec too.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)"
_DURATION_RE = re.compile(rf"^(?:{_PART})+$")
# The same grammar as a JSON-schema pattern, so the API server rejects garbage before the operator sees it.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"


def parse_duration(text: str) -> float:
    """Return seconds for a Go/Kubernetes duration string; raise ValueError with the accepted syntax."""
    cleaned = text.strip()
    if not _DURATION_RE.match(cleaned):
        raise ValueError(
            f"{text!r} is not a duration; write a number with a unit (ns, us, ms, s, m, h), "
            'e.g. "300ms", "2s" or "1m30s"'
        )
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in re.findall(_PART, cleaned))


def format_duration(seconds: float) -> str:
    """Shortest readable form, used when the tuner writes observed figures back."""
    if seconds >= 1:
        return f"{seconds:g}s"
    return f"{seconds * 1e3:g}ms"


class Duration(float):
    """A positive duration in seconds that remembers how the user wrote it.

    It behaves as a float (seconds) in arithmetic, and serialises back to the user's text so that a
    round trip through the CRD does not rewrite "300ms" as "0.3".
    """

    text: str

    def __new__(cls, text: str) -> Duration:
        if text.strip().startswith("-"):
            raise ValueError(f"{text!r} is negative; latencies and intervals must be positive")
        seconds = parse_duration(text)
        if seconds <= 0:
            raise ValueError(f'{text!r} must be a positive duration, e.g. "300ms"')
        obj = super().__new__(cls, seconds)
        obj.text = text.strip()
        return obj

    def __repr__(self) -> str:
        return f"Duration({self.text!r})"

    def __str__(self) -> str:
        return self.text

    @property
    def ms(self) -> float:
        return float(self) * 1e3

    @classmethod
    def __get_pydantic_core_schema__(
        cls, _source: Any, _handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def validate(value: Any) -> Duration:
            if isinstance(value, Duration):
                return value
            if isinstance(value, bool) or not isinstance(value, str):
                raise ValueError(
                    f'{value!r} is not a duration string; write it with a unit, e.g. "300ms" or "2s"'
                )
            return cls(value)

        return core_schema.no_info_plain_validator_function(
            validate,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda d: d.text),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, _schema: core_schema.CoreSchema, _handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"type": "string", "pattern": DURATION_PATTERN}
