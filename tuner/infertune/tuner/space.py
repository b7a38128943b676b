"""The search space: the spec's knobs, filtered by what each engine runs here, pruned by the roofline.

Torch-free. Every value removed is recorded with its reason, and the result says what was pruned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from infertune.tuner.api import TuningSpec
from infertune.tuner.api.base import to_camel
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import Capabilities, EngineAdapter, get_adapter
from infertune.tuner.hardware import Hardware
from infertune.tuner.knobs import SERVING_KNOBS
from infertune.tuner.models import variant_methods


@dataclass(frozen=True)
class Pruned:
    """A value (or combination) never tried, and why."""

    engine: str
    knob: str
    value: Any
    reason: str
    rule: str  # capability, memory, roofline, constraint, quality

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "knob": self.knob,
            "value": self.value,
            "reason": self.reason,
            "rule": self.rule,
        }


@dataclass
class EngineSpace:
    engine: str
    quantizations: list[str]
    max_num_seqs: list[int]
    max_num_batched_tokens: list[int]
    kv_block_sizes: list[int]
    cuda_graph: list[bool]
    # The knobs only some engines honour (tensor_parallel_size, kv_cache_dtype...): name -> values.
    extra: dict[str, list[Any]] = field(default_factory=dict)
    # The engine version's options as the operator needs them (EngineAdapter.options_wire).
    options: dict[str, Any] | None = None
    # Precision -> --quantization method of the pre-quantized checkpoint it is served from.
    quantization_methods: dict[str, str] = field(default_factory=dict)

    def by_knob(self) -> dict[str, list[Any]]:
        """The values searched for each knob other than the engine, keyed by knob name."""
        return {
            "quantization": list(self.quantizations),
            "max_num_seqs": list(self.max_num_seqs),
            "max_num_batched_tokens": list(self.max_num_batched_tokens),
            "kv_block_size": list(self.kv_block_sizes),
            "cuda_graph": list(self.cuda_graph),
            **{k: list(v) for k, v in self.extra.items()},
        }

    def size(self) -> int:
        return math.prod(len(values) for values in self.by_knob().values())

    def candidates(self) -> list[Candidate]:
        knobs = self.by_knob()
        return [
            Candidate(engine=self.engine, **dict(zip(knobs, values, strict=True)))
            for values in product(*knobs.values())
        ]


@dataclass
class Space:
    engines: dict[str, EngineSpace]
    pruned: list[Pruned] = field(default_factory=list)

    def size(self) -> int:
        return sum(e.size() for e in self.engines.values())

    def candidates(self) -> list[Candidate]:
        return [c for e in self.engines.values() for c in e.candidates()]

    def contains(self, c: Candidate) -> bool:
        e = self.engines.get(c.engine)
        return e is not None and all(c[k] in values for k, values in e.by_knob().items())

    def drop_quantization(self, engine: str, quantization: str, reason: str, rule: str) -> None:
        e = self.engines.get(engine)
        if e is None or quantization not in e.quantizations:
            return
        e.quantizations.remove(quantization)
        self.pruned.append(Pruned(engine, "quantization", quantization, reason, rule))
        if not e.quantizations:
            del self.engines[engine]
            self.pruned.append(
                Pruned(engine, "engine", engine, "every quantization was pruned", rule)
            )

    def drop_engine(self, engine: str, reason: str, rule: str) -> None:
        """Remove a whole engine from the space, recording why (no-op when it is not there)."""
        if self.engines.pop(engine, None) is not None:
            self.pruned.append(Pruned(engine, "engine", engine, reason, rule))

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size(),
            "engines": {
                name: {
                    "quantizations": e.quantizations,
                    "maxNumSeqs": e.max_num_seqs,
                    "maxNumBatchedTokens": e.max_num_batched_tokens,
                    "kvBlockSizes": e.kv_block_sizes,
                    "cudaGraph": e.cuda_graph,
                    **{to_camel(k): v for k, v in e.extra.items()},
                    **({"engineOptions": e.options} if e.options else {}),
                    **(
                        {"quantizationMethods": e.quantization_methods}
                        if e.quantization_methods
                        else {}
                    ),
                }
                for name, e in self.engines.items()
            },
            "pruned": [p.to_dict() for p in self.pruned],
        }


def extra_values(spec: TuningSpec, hardware: Hardware) -> dict[str, list[Any]]:
    """The spec's values of the knobs only some engines honour (one value: not searched)."""
    search = spec.search
    tp = search.tensor_parallel_sizes or [hardware.count if hardware.is_gpu else 1]
    return {
        "tensor_parallel_size": list(tp),
        "kv_cache_dtype": list(search.kv_cache_dtypes),
        "gpu_memory_fraction": list(search.gpu_memory_fractions),
        "prefix_caching": list(search.prefix_caching),
        "chunked_prefill": list(search.chunked_prefill),
        "max_model_len": [spec.model.max_model_len or 0],
    }


def _filter_extra(
    engine: str, values: dict[str, list[Any]], caps: Capabilities, pruned: list[Pruned]
) -> dict[str, list[Any]]:
    """The engine's knobs among `values`, less the values its capabilities refuse (recorded)."""
    out: dict[str, list[Any]] = {}
    for knob in SERVING_KNOBS.honoured_by(engine):
        if knob.name not in values:
            continue
        refused = caps.refused.get(knob.name, {})
        for v in values[knob.name]:
            if v in refused:
                pruned.append(Pruned(engine, to_camel(knob.name), v, refused[v], "capability"))
        out[knob.name] = [v for v in values[knob.name] if v not in refused]
    return out


def build_space(
    spec: TuningSpec,
    hardware: Hardware,
    adapters: dict[str, EngineAdapter] | None = None,
) -> Space:
    """The spec's space, with each engine's values filtered by its capabilities on `hardware`."""
    search = spec.search
    extra = extra_values(spec, hardware)
    pruned: list[Pruned] = []
    engines: dict[str, EngineSpace] = {}
    seqs = search.max_num_seqs.candidates()
    tokens = search.max_num_batched_tokens.candidates()
    methods = variant_methods(spec.model)
    for engine, quants in search.engine_quantizations().items():
        adapter = (adapters or {}).get(engine) or get_adapter(engine, quant_methods=methods)
        caps = adapter.capabilities(hardware)
        if not caps.runnable:
            pruned.append(
                Pruned(
                    engine, "engine", engine, caps.why_not_runnable or "not runnable", "capability"
                )
            )
            continue
        missing = adapter.missing()
        if missing:
            pruned.append(Pruned(engine, "engine", engine, missing, "capability"))
            continue
        keep_q = [q for q in quants if q in caps.quantizations]
        for q in quants:
            if q not in caps.quantizations:
                reason = caps.refused.get("quantization", {}).get(q)
                pruned.append(
                    Pruned(
                        engine,
                        "quantization",
                        q,
                        reason or f"{engine} cannot run {q} on {hardware.describe()}",
                        "capability",
                    )
                )
        blocks = list(search.kv_block_sizes)
        if caps.kv_block_sizes is not None:
            if not caps.kv_block_sizes:  # the engine has no such knob: hold it at one value
                for b in blocks[1:]:
                    pruned.append(
                        Pruned(
                            engine, "kvBlockSize", b, f"{engine} has no KV page size", "capability"
                        )
                    )
                blocks = blocks[:1]
            else:
                for b in blocks:
                    if b not in caps.kv_block_sizes:
                        pruned.append(
                            Pruned(
                                engine,
                                "kvBlockSize",
                                b,
                                f"{engine} allows {sorted(caps.kv_block_sizes)}",
                                "capability",
                            )
                        )
                blocks = [b for b in blocks if b in caps.kv_block_sizes]
        graphs = [g for g in search.cuda_graph if g in caps.cuda_graph]
        for g in search.cuda_graph:
            if g not in caps.cuda_graph:
                pruned.append(
                    Pruned(
                        engine,
                        "cudaGraph",
                        g,
                        f"CUDA graphs need a GPU ({hardware.describe()})",
                        "capability",
                    )
                )
        eng_tokens = list(tokens)
        more = _filter_extra(engine, extra, caps, pruned)
        if keep_q and blocks and graphs and all(more.values()):
            served = {q: m for q, m in adapter.quant_methods.items() if q in keep_q and m}
            engines[engine] = EngineSpace(
                engine,
                keep_q,
                list(seqs),
                eng_tokens,
                blocks,
                graphs,
                more,
                adapter.options_wire(),
                served,
            )
        else:
            empty = [("quantization", keep_q), ("kvBlockSize", blocks), ("cudaGraph", graphs)]
            empty += [(to_camel(k), v) for k, v in more.items()]
            knobs = ", ".join(name for name, values in empty if not values)
            pruned.append(
                Pruned(
                    engine, "engine", engine, f"no runnable value left for {knobs}", "capability"
                )
            )
    return Space(engines, pruned)


def why_unavailable(space: Space) -> str:
    """Per engine the spec asked for and the space lost: why, with each refused value's reason
    (what to install or provide). One line per engine; empty when every engine is left."""
    lines: list[str] = []
    for engine in dict.fromkeys(p.engine for p in space.pruned if p.knob == "engine"):
        if engine in space.engines:
            continue
        reasons = [p for p in space.pruned if p.engine == engine]
        head = next(p.reason for p in reasons if p.knob == "engine")
        values = [f"{p.knob}={p.value}: {p.reason}" for p in reasons if p.knob != "engine"]
        lines.append(f"{engine}: {head}" + (f" ({'; '.join(values)})" if values else ""))
    return "\n".join(lines)
