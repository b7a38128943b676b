"""The one small interface every serving engine is driven through.

An adapter turns a :class:`Candidate` into a command line and environment, says where the engine
reports health, maps its Prometheus metrics onto ours, and states what it can run on this hardware.
The operator's Deployment builder calls the same ``command()`` so that production runs the exact
argv the tuner measured.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from pathlib import Path

from infertune.tuner.api.base import ENGINE_QUANTIZATIONS
from infertune.tuner.candidate import Candidate
from infertune.tuner.hardware import Hardware


class AdapterError(ValueError):
    """A configuration an adapter cannot express; the message names the knob and allowed values."""


@dataclass(frozen=True)
class Capabilities:
    """What an engine can run on the hardware at hand."""

    quantizations: frozenset[str]
    kv_block_sizes: frozenset[int] | None  # None: any power of two the spec allows
    cuda_graph: frozenset[bool]
    runnable: bool = True  # False: argv only (e.g. needs a GPU this machine lacks)
    why_not_runnable: str | None = None
    # Knobs the engine can change without a restart (none of today's engines can).
    runtime_knobs: frozenset[str] = frozenset()
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    health_path: str
    served_model_name: str


class EngineAdapter(abc.ABC):
    name: str = ""
    health_path: str = "/health"
    # Our metric name -> the engine's Prometheus metric (for the operator's live SLO check).
    metrics: dict[str, str] = {}

    @abc.abstractmethod
    def capabilities(self, hardware: Hardware) -> Capabilities:
        """Quantizations, KV block sizes and CUDA-graph settings this engine runs on `hardware`."""

    @abc.abstractmethod
    def program(self) -> list[str]:
        """The local program that takes :meth:`flags`: an interpreter and `-m module`, or a binary.
        An engine's container image has its own entry point; the operator swaps this part only."""

    @abc.abstractmethod
    def flags(
        self,
        config: Candidate,
        model_path: str,
        host: str,
        port: int,
        *,
        served_model_name: str | None = None,
    ) -> list[str]:
        """The engine's own arguments that serve `config` on host:port."""

    def command(
        self,
        config: Candidate,
        model_path: str,
        host: str,
        port: int,
        *,
        served_model_name: str | None = None,
    ) -> list[str]:
        """The argv that serves `config` on host:port on this machine."""
        flags = self.flags(config, model_path, host, port, served_model_name=served_model_name)
        return [*self.program(), *flags]

    def env(self, config: Candidate) -> dict[str, str]:
        """Extra environment for the engine process."""
        return {}

    def prepare_model(self, model_dir: Path, config: Candidate, workdir: Path) -> Path:
        """The model path the engine loads for `config` (an adapter may convert the checkpoint)."""
        return model_dir

    def missing(self) -> str | None:
        """Why the engine cannot be started here (not installed...), or None when it can."""
        return None

    def launch(
        self,
        config: Candidate,
        model_path: str,
        host: str,
        port: int,
        *,
        served_model_name: str | None = None,
    ) -> Launch:
        self.check(config)
        name = served_model_name or default_served_name(model_path)
        argv = self.command(config, model_path, host, port, served_model_name=name)
        return Launch(argv, self.env(config), self.health_path, name)

    def check(self, config: Candidate) -> None:
        """Reject a configuration the engine cannot express (independent of the hardware)."""
        if config.engine != self.name:
            raise AdapterError(f"configuration is for engine {config.engine!r}, not {self.name!r}")
        allowed = ENGINE_QUANTIZATIONS[self.name]
        if config.quantization not in allowed:
            raise AdapterError(
                f"quantization {config.quantization!r} is not supported by {self.name}; "
                f"allowed values: {sorted(allowed)}"
            )

    def needs_restart(self, old: Candidate, new: Candidate, hardware: Hardware) -> bool:
        """True unless only knobs the running engine can change at runtime differ."""
        changed = {k for k, v in old.to_dict().items() if new.to_dict()[k] != v}
        return bool(changed - self.capabilities(hardware).runtime_knobs)


def default_served_name(model_path: str) -> str:
    tail = Path(model_path.rstrip("/")).name or "model"
    return re.sub(r"[^A-Za-z0-9._-]", "-", tail)


def ints(values: frozenset[int] | set[int] | list[int]) -> list[int]:
    return sorted(values)
