"""The one small interface every serving engine is driven through.

An adapter turns a :class:`Candidate` into a command line and environment, says where the engine
reports health, and states what it can run on this hardware. Its ``knob_flags`` table maps each knob
the engine honours (``infertune.tuner.knobs``) onto the engine's own flags, one entry per knob.
The operator's Deployment builder calls the same ``flags()`` so that production runs the exact argv
the tuner measured.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from infertune.tuner.api.base import ENGINE_QUANTIZATIONS
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.options import EngineOptions
from infertune.tuner.hardware import Hardware


class AdapterError(ValueError):
    """A configuration an adapter cannot express; the message names the knob and allowed values."""


@dataclass(frozen=True)
class Versioned:
    """A knob's flags that depend on the engine version's options (a flag renamed or split)."""

    render: Callable[[Any, Candidate, EngineOptions], list[str]]


# A knob's value (and the whole configuration, for flags that depend on other knobs) -> flags.
FlagRule = Callable[[Any, Candidate], list[str]] | Versioned


def flag(name: str) -> FlagRule:
    """``name VALUE``."""
    return lambda value, _config: [name, str(value)]


def switch(on: str | None, off: str | None = None) -> FlagRule:
    """A flag when the knob is true, another (or none) when it is false."""
    return lambda value, _config: [f] if (f := on if value else off) else []


def no_flag(_value: Any, _config: Candidate) -> list[str]:
    """A knob the engine honours some other way (its environment, the model file it loads)."""
    return []


def precision_flags(
    engine: str, dtypes: Mapping[str, list[str]], quantizations: Mapping[str, list[str]]
) -> FlagRule:
    """Our precision names -> the engine's dtype or quantization flags."""

    def rule(value: Any, _config: Candidate) -> list[str]:
        flags = dtypes.get(value, quantizations.get(value))
        if flags is None:
            raise AdapterError(
                f"quantization {value!r} has no {engine} flag; allowed values: "
                f"{sorted([*dtypes, *quantizations])}"
            )
        return list(flags)

    return rule


PREQUANTIZED = ("int8", "int4")  # served by vLLM/SGLang only from a pre-quantized checkpoint


def variant_quantizations(
    engine: str, quant_methods: Mapping[str, str | None]
) -> tuple[frozenset[str], dict[str, str]]:
    """The pre-quantized precisions `engine` can serve (a checkpoint and its method are known),
    and for the others why not: what to put in the spec."""
    offered: set[str] = set()
    refused: dict[str, str] = {}
    for q in PREQUANTIZED:
        if q not in quant_methods:
            refused[q] = (
                f"{q} on {engine} needs a pre-quantized {q} checkpoint: set "
                f"model.variants.{q}.uri to an AWQ/GPTQ checkpoint of the model (e.g. "
                "hf://org/model-AWQ); quantizing a bf16 checkpoint on load is not a latency option"
            )
        elif quant_methods[q] is None:
            refused[q] = (
                f"{q} on {engine}: the method of model.variants.{q} is unknown (no "
                "quantization_config.quant_method in a local config.json at tuning time); set "
                f"model.variants.{q}.method"
            )
        else:
            offered.add(q)
    return frozenset(offered), refused


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
    # Knob -> value -> why this engine (version) cannot run it here: pruned from the space.
    refused: Mapping[str, Mapping[Any, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    health_path: str
    served_model_name: str


class EngineAdapter(abc.ABC):
    name: str = ""
    health_path: str = "/health"
    # Knob name -> its flags, for every knob this engine honours (KnobSet.honoured_by).
    knob_flags: ClassVar[Mapping[str, FlagRule]] = {}
    # The flags whose presence differs between the engine's versions: the mapping branches on
    # them, and the tuner's summary carries which exist (EngineOptions.to_wire) to the operator.
    versioned_flags: ClassVar[tuple[str, ...]] = ()
    # The options assumed when none are known (no engine installed, a record older than them).
    default_options: ClassVar[EngineOptions | None] = None

    def __init__(
        self,
        *,
        options: EngineOptions | None = None,
        quant_methods: Mapping[str, str | None] | None = None,
    ) -> None:
        self._options = options
        # Precision -> --quantization method of the spec's pre-quantized checkpoint for it
        # (models.variant_methods; None: a checkpoint whose method nobody said). vLLM/SGLang only.
        self.quant_methods: dict[str, str | None] = dict(quant_methods or {})

    @property
    def options(self) -> EngineOptions | None:
        """The engine version's options: given, else learned from the installed engine, else
        the adapter's default."""
        if self._options is None:
            self._options = self.learn_options() or self.default_options
        return self._options

    def learn_options(self) -> EngineOptions | None:
        """The installed engine's options (run its parser once; cached on disk), or None."""
        return None

    def options_wire(self) -> dict[str, Any] | None:
        """What the operator needs to render this version's flags (None: no versioned flags)."""
        options = self.options
        return options.to_wire(self.versioned_flags) if options is not None else None

    @abc.abstractmethod
    def capabilities(self, hardware: Hardware) -> Capabilities:
        """Quantizations, KV block sizes and CUDA-graph settings this engine runs on `hardware`."""

    @abc.abstractmethod
    def program(self) -> list[str]:
        """The local program that takes :meth:`flags`: an interpreter and `-m module`, or a binary.
        An engine's container image has its own entry point; the operator swaps this part only."""

    @abc.abstractmethod
    def server_flags(
        self, model_path: str, host: str, port: int, *, served_model_name: str | None = None
    ) -> list[str]:
        """The engine's arguments that do not come from a knob: the model, the address, and
        settings held fixed for every configuration."""

    def validate(self, config: Candidate) -> None:  # noqa: B027 (a hook: most engines take any)
        """Reject combinations of knob values the engine refuses (none by default)."""

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
        self.validate(config)
        fixed = self.server_flags(model_path, host, port, served_model_name=served_model_name)
        return [*fixed, *self.knob_argv(config)]

    def knob_argv(self, config: Candidate) -> list[str]:
        """The flags of every knob this engine honours, in the knobs' declared order."""
        argv: list[str] = []
        for knob in config.knobs.honoured_by(self.name):
            if knob.name == "quantization" and config.quantization in self.quant_methods:
                argv += self.prequantized_flags(config.quantization)
                continue
            rule = self.knob_flags.get(knob.name)
            if rule is None:
                raise AdapterError(
                    f"engine {self.name!r} honours knob {knob.name!r} but its adapter maps no "
                    "flag for it (add an entry to knob_flags)"
                )
            if isinstance(rule, Versioned):
                options = self.options
                if options is None:
                    raise AdapterError(f"{self.name} has no known options to map {knob.name!r}")
                argv += rule.render(config[knob.name], config, options)
            else:
                argv += rule(config[knob.name], config)
        return argv

    def prequantized_flags(self, quantization: str) -> list[str]:
        """The flags that serve a pre-quantized checkpoint: its own dtype, the spec's method."""
        method = self.quant_methods.get(quantization)
        if method is None:
            raise AdapterError(
                f"{quantization} on {self.name}: the pre-quantized checkpoint's method is unknown; "
                f"set model.variants.{quantization}.method"
            )
        return ["--dtype", "auto", "--quantization", method]

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


class OwnInterpreterAdapter(EngineAdapter):
    """An engine that runs in an interpreter of its own (vLLM, SGLang): `python` names it, or
    None for the one the configuration names (see engines/interpreter.py)."""

    def __init__(
        self,
        python: str | None = None,
        *,
        options: EngineOptions | None = None,
        quant_methods: Mapping[str, str | None] | None = None,
    ) -> None:
        super().__init__(options=options, quant_methods=quant_methods)
        self.python = python
