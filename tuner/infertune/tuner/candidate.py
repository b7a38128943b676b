"""One serving configuration: the point the study samples, the trial measures and the operator deploys.

Torch-free and engine-neutral: every knob has one name here, and each engine adapter maps it onto
its own flags.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

KNOBS: tuple[str, ...] = (
    "engine",
    "quantization",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_block_size",
    "cuda_graph",
)
# camelCase names used on the wire (the operator's ServingConfig and the compact summary).
WIRE_NAMES: dict[str, str] = {
    "engine": "engine",
    "quantization": "quantization",
    "max_num_seqs": "maxNumSeqs",
    "max_num_batched_tokens": "maxNumBatchedTokens",
    "kv_block_size": "kvBlockSize",
    "cuda_graph": "cudaGraph",
}


@dataclass(frozen=True, order=True)
class Candidate:
    engine: str
    quantization: str
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_block_size: int
    cuda_graph: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_wire(self) -> dict[str, Any]:
        return {WIRE_NAMES[k]: v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Candidate:
        missing = [k for k in KNOBS if k not in raw]
        if missing:
            raise ValueError(f"configuration is missing {missing}; it needs every knob of {KNOBS}")
        return cls(
            engine=str(raw["engine"]),
            quantization=str(raw["quantization"]),
            max_num_seqs=int(raw["max_num_seqs"]),
            max_num_batched_tokens=int(raw["max_num_batched_tokens"]),
            kv_block_size=int(raw["kv_block_size"]),
            cuda_graph=bool(raw["cuda_graph"]),
        )

    @property
    def config_hash(self) -> str:
        """Stable short id of the configuration (the operator labels Deployments with it)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def label(self) -> str:
        graph = "graph" if self.cuda_graph else "eager"
        return (
            f"{self.engine}/{self.quantization} seqs={self.max_num_seqs} "
            f"tokens={self.max_num_batched_tokens} block={self.kv_block_size} {graph}"
        )
