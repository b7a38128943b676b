"""The serving knobs, declared once.

Every other view of a serving configuration derives from :data:`SERVING_KNOBS`: the tuner's
:class:`~infertune.tuner.candidate.Candidate`, the operator's status model (and so the CRD), the
tuner's compact summary, the report, and each engine adapter's flag table (which maps the knobs an
engine honours onto its own command line, one line per knob). Adding a knob is one entry here plus
one line in each adapter that honours it; a conformance test checks that every adapter maps exactly
the knobs declared for it.

Torch-free and free of the rest of the tuner: the operator imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infertune.tuner.api.base import ENGINES, to_camel

KnobValue = str | int | float | bool


@dataclass(frozen=True)
class Knob:
    """One serving knob: its name, type, default and which engines honour it.

    ``default`` None means every configuration must give the knob; a knob added later should
    carry a default, so configurations recorded before it existed (a study, a status) still read.
    """

    name: str
    type: type[str] | type[int] | type[float] | type[bool]
    description: str
    engines: frozenset[str]
    short: Callable[[Any], str]
    default: KnobValue | None = None

    @property
    def wire(self) -> str:
        """The camelCase name on the wire (status, CRD, the tuner's summary)."""
        return to_camel(self.name)

    def coerce(self, value: Any) -> KnobValue:
        """The value as this knob's type; a bool knob takes only real booleans (or 0/1)."""
        if self.type is bool:
            if isinstance(value, bool) or value in (0, 1):
                return bool(value)
            raise ValueError(f"knob {self.name!r} takes true or false, not {value!r}")
        try:
            return self.type(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"knob {self.name!r} takes a {self.type.__name__}, not {value!r}"
            ) from None


class KnobSet:
    """An ordered set of knobs: the order is the order of a configuration's fields everywhere."""

    def __init__(self, knobs: Sequence[Knob]) -> None:
        names = [k.name for k in knobs]
        if len(set(names)) != len(names):
            raise ValueError(f"knob names repeat: {names}")
        self._knobs = tuple(knobs)
        self._by_name = {k.name: k for k in knobs}

    def __iter__(self) -> Iterator[Knob]:
        return iter(self._knobs)

    def __len__(self) -> int:
        return len(self._knobs)

    def __getitem__(self, name: str) -> Knob:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)

    def honoured_by(self, engine: str) -> tuple[Knob, ...]:
        return tuple(k for k in self._knobs if engine in k.engines)

    def with_knobs(self, *more: Knob) -> KnobSet:
        """These knobs followed by `more` (a deployment's extension, or a test's)."""
        return KnobSet([*self._knobs, *more])

    def parse(self, raw: Mapping[str, Any], *, wire: bool = False) -> tuple[KnobValue, ...]:
        """The values of a configuration, in knob order, typed; missing knobs take their default.

        `wire`: the keys are camelCase. Raises ValueError naming what is missing or mistyped.
        """
        values: list[KnobValue] = []
        missing: list[str] = []
        for knob in self._knobs:
            key = knob.wire if wire else knob.name
            if key in raw:
                values.append(knob.coerce(raw[key]))
            elif knob.default is not None:
                values.append(knob.default)
            else:
                missing.append(key)
        if missing:
            every = [k.wire if wire else k.name for k in self._knobs]
            raise ValueError(f"configuration is missing {missing}; it needs every knob of {every}")
        return tuple(values)

    def describe(self, values: Mapping[str, Any]) -> str:
        """One line a person reads: ``vllm/bf16 seqs=32 tokens=2048 block=16 graph``."""
        # A knob added later is named only when it differs from its default (the label stays short).
        parts = [
            k.short(values[k.name])
            for k in self._knobs
            if k.name in values and (k.default is None or values[k.name] != k.default)
        ]
        head = "/".join(parts[:2])  # the engine and the precision read as one word
        return " ".join([head, *parts[2:]]) if head else ""


def _is(name: str) -> Callable[[Any], str]:
    return lambda value: f"{name}={value}"


def _on(word: str) -> Callable[[Any], str]:
    return lambda on: word if on else f"no-{word}"


ALL_ENGINES = frozenset(ENGINES)
# The GPU servers: the knobs below exist on them only (the built-in engine and llama.cpp take none).
SERVERS = frozenset({"vllm", "sglang"})

SERVING_KNOBS = KnobSet(
    [
        Knob(
            "engine",
            str,
            "Serving engine (builtin, vllm, llamacpp, sglang); it selects the adapter, "
            "so no engine takes it as a flag.",
            engines=frozenset(),
            short=str,
        ),
        Knob(
            "quantization",
            str,
            "Weight precision or quantization (fp32, bf16, fp16, fp8, int8, int4).",
            engines=ALL_ENGINES,
            short=str,
        ),
        Knob(
            "max_num_seqs",
            int,
            "Most sequences batched at once (the engine's concurrency limit).",
            engines=ALL_ENGINES,
            short=_is("seqs"),
        ),
        Knob(
            "max_num_batched_tokens",
            int,
            "Most tokens one engine step processes (the prefill chunk budget).",
            engines=ALL_ENGINES,
            short=_is("tokens"),
        ),
        Knob(
            "kv_block_size",
            int,
            "KV-cache page size in tokens.",
            engines=frozenset({"builtin", "vllm", "sglang"}),
            short=_is("block"),
        ),
        Knob(
            "cuda_graph",
            bool,
            "Replay decode steps as CUDA Graphs (GPU only).",
            engines=ALL_ENGINES,
            short=lambda on: "graph" if on else "eager",
        ),
        # Added later: each has a default, so configurations recorded before still read, and a
        # spec that leaves it out searches one value (the default). Each is pinned in the argv.
        Knob(
            "tensor_parallel_size",
            int,
            "GPUs one replica's engine shards the model over (hardware.gpusPerReplica).",
            engines=SERVERS,
            short=_is("tp"),
            default=1,
        ),
        Knob(
            "kv_cache_dtype",
            str,
            "KV-cache element type: auto (the model's dtype) or fp8.",
            engines=SERVERS,
            short=_is("kv"),
            default="auto",
        ),
        Knob(
            "gpu_memory_fraction",
            float,
            "Fraction of GPU memory the engine may take for weights and KV cache "
            "(vLLM --gpu-memory-utilization, SGLang --mem-fraction-static).",
            engines=SERVERS,
            short=_is("mem"),
            default=0.9,
        ),
        Knob(
            "prefix_caching",
            bool,
            "Reuse the KV cache of shared prompt prefixes (SGLang's radix cache).",
            engines=SERVERS,
            short=_on("prefix"),
            default=True,
        ),
        Knob(
            "chunked_prefill",
            bool,
            "Split long prompts into chunks of maxNumBatchedTokens mixed with decode steps.",
            engines=SERVERS,
            short=_on("chunked"),
            default=True,
        ),
        Knob(
            "max_model_len",
            int,
            "Longest sequence (prompt + output) the engine admits: model.maxModelLen; "
            "0 leaves it to the model's config.",
            engines=SERVERS,
            short=_is("len"),
            default=0,
        ),
    ]
)
