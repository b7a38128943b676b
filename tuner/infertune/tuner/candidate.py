"""One serving configuration: the point the study samples, the trial measures and the operator deploys.

Torch-free and engine-neutral. Its fields are the knobs of :mod:`infertune.tuner.knobs`, in their
declared order; each engine adapter maps them onto its own flags. The typed properties below are
conveniences for the code that reasons about a particular knob (the roofline, the space); a knob
added to the declaration is carried, compared, hashed and sent on the wire without them.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from infertune.tuner.knobs import SERVING_KNOBS, KnobSet, KnobValue


@functools.total_ordering
class Candidate:
    """An immutable, hashable, ordered set of knob values.

    ``Candidate("vllm", "bf16", 32, 2048, 16, True)`` (positional, in knob order) or by keyword;
    knobs left out take their declared default, and a knob without one must be given.
    """

    __slots__ = ("_values", "knobs")
    _values: tuple[KnobValue, ...]
    knobs: KnobSet

    def __init__(self, *args: Any, knobs: KnobSet = SERVING_KNOBS, **kwargs: Any) -> None:
        if len(args) > len(knobs):
            raise TypeError(f"{len(args)} values for {len(knobs)} knobs {list(knobs.names)}")
        given = dict(zip(knobs.names, args, strict=False))
        unknown = sorted(set(kwargs) - set(knobs.names))
        if unknown:
            raise TypeError(f"unknown knobs {unknown}; the knobs are {list(knobs.names)}")
        twice = sorted(set(kwargs) & set(given))
        if twice:
            raise TypeError(f"knobs given twice: {twice}")
        object.__setattr__(self, "knobs", knobs)
        object.__setattr__(self, "_values", knobs.parse({**given, **kwargs}))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Candidate is immutable; use replace()")

    def __getitem__(self, name: str) -> KnobValue:
        return self._values[self.knobs.names.index(name)]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Candidate):
            return NotImplemented
        return self.knobs.names == other.knobs.names and self._values == other._values

    def __lt__(self, other: Candidate) -> bool:
        return self._values < other._values

    def __hash__(self) -> int:
        return hash((self.knobs.names, self._values))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"Candidate({inner})"

    def __reduce__(self) -> tuple[Any, ...]:
        # The declared knobs are found again by import; another set travels with the values.
        if self.knobs is SERVING_KNOBS:
            return (_rebuild, (self.to_dict(),))
        return (_rebuild, (self.to_dict(), self.knobs))

    def replace(self, **changes: Any) -> Candidate:
        return Candidate(knobs=self.knobs, **{**self.to_dict(), **changes})

    # Typed views of the knobs the tuner's own arithmetic reads.
    @property
    def engine(self) -> str:
        return str(self["engine"])

    @property
    def quantization(self) -> str:
        return str(self["quantization"])

    @property
    def max_num_seqs(self) -> int:
        return int(self["max_num_seqs"])

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self["max_num_batched_tokens"])

    @property
    def kv_block_size(self) -> int:
        return int(self["kv_block_size"])

    @property
    def cuda_graph(self) -> bool:
        return bool(self["cuda_graph"])

    def to_dict(self) -> dict[str, Any]:
        return dict(zip(self.knobs.names, self._values, strict=True))

    def to_wire(self) -> dict[str, Any]:
        """camelCase keys, as the operator's status and the tuner's summary carry them."""
        return {k.wire: v for k, v in zip(self.knobs, self._values, strict=True)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], knobs: KnobSet = SERVING_KNOBS) -> Candidate:
        """From snake_case keys; other keys (figures, a hash) are ignored."""
        return cls(knobs=knobs, **{k: raw[k] for k in knobs.names if k in raw})

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any], knobs: KnobSet = SERVING_KNOBS) -> Candidate:
        """From camelCase keys; other keys are ignored."""
        return cls(knobs=knobs, **{k.name: raw[k.wire] for k in knobs if k.wire in raw})

    @property
    def config_hash(self) -> str:
        """Stable short id of the configuration (the operator labels Deployments with it)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def label(self) -> str:
        return self.knobs.describe(self.to_dict())


def _rebuild(values: dict[str, Any], knobs: KnobSet = SERVING_KNOBS) -> Candidate:
    return Candidate(knobs=knobs, **values)
