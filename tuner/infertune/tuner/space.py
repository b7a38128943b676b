"""The search space: the spec's knobs, filtered by what each engine runs here, pruned by the roofline.

Torch-free. Every value removed is recorded with its reason, and the result says what was pruned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import EngineAdapter, get_adapter
from infertune.tuner.hardware import Hardware


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

    def by_knob(self) -> dict[str, list[Any]]:
        """The values searched for each knob other than the engine, keyed by knob name."""
        return {
            "quantization": list(self.quantizations),
            "max_num_seqs": list(self.max_num_seqs),
            "max_num_batched_tokens": list(self.max_num_batched_tokens),
            "kv_block_size": list(self.kv_block_sizes),
            "cuda_graph": list(self.cuda_graph),
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
        return (
            e is not None
            and c.quantization in e.quantizations
            and c.max_num_seqs in e.max_num_seqs
            and c.max_num_batched_tokens in e.max_num_batched_tokens
            and c.kv_block_size in e.kv_block_sizes
            and c.cuda_graph in e.cuda_graph
        )

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
                }
                for name, e in self.engines.items()
            },
            "pruned": [p.to_dict() for p in self.pruned],
        }


def build_space(
    spec: TuningSpec,
    hardware: Hardware,
    adapters: dict[str, EngineAdapter] | None = None,
) -> Space:
    """The spec's space, with each engine's values filtered by its capabilities on `hardware`."""
    search = spec.search
    pruned: list[Pruned] = []
    engines: dict[str, EngineSpace] = {}
    seqs = search.max_num_seqs.candidates()
    tokens = search.max_num_batched_tokens.candidates()
    for engine, quants in search.engine_quantizations().items():
        adapter = (adapters or {}).get(engine) or get_adapter(engine)
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
                pruned.append(
                    Pruned(
                        engine,
                        "quantization",
                        q,
                        f"{engine} cannot run {q} on {hardware.describe()}",
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
        if keep_q and blocks and graphs:
            engines[engine] = EngineSpace(engine, keep_q, list(seqs), eng_tokens, blocks, graphs)
        else:
            pruned.append(
                Pruned(
                    engine, "engine", engine, "no runnable value left for some knob", "capability"
                )
            )
    return Space(engines, pruned)
