"""The options an installed engine accepts: learned once per interpreter and version, cached on disk.

An adapter maps each knob to the flag its engine's version has (vLLM renamed its CUDA-graph flags,
SGLang split ``--cuda-graph-max-bs``). It learns that version's options by running
``probe_options.py`` (the engine's own argument parser) in the engine's interpreter, once per
interpreter path and engine version; the result is cached under ``~/.cache/infertune/engine_options``
($INFERTUNE_CACHE overrides the root). The operator has no engine installed: the tuner's summary
carries the version and the version-dependent flags it found (:meth:`EngineOptions.to_wire`), and
the operator renders the Deployment's argv for that record.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROBE = Path(__file__).with_name("probe_options.py")
MARK = "INFERTUNE_OPTIONS "
PROBE_TIMEOUT_S = 300


@dataclass(frozen=True)
class EngineOptions:
    """One engine version's accepted options: flag -> its choices (None: any value or a switch).

    ``complete`` is False for a record carried on the wire, which lists only the flags an adapter's
    mapping branches on; every other flag is then assumed present.
    """

    engine: str
    version: str
    options: Mapping[str, tuple[str, ...] | None] = field(default_factory=dict)
    complete: bool = True

    def has(self, flag: str) -> bool:
        return flag in self.options

    def choices(self, flag: str) -> tuple[str, ...] | None:
        return self.options.get(flag)

    def allows(self, flag: str, value: str) -> bool:
        """The flag exists and takes `value` (a flag without listed choices takes any)."""
        if not self.complete:
            return True
        if flag not in self.options:
            return False
        choices = self.options[flag]
        return choices is None or value in choices

    def to_wire(self, versioned: Iterable[str]) -> dict[str, Any]:
        """Version and which of the `versioned` flags exist: all the operator's mapping needs."""
        return {"version": self.version, "flags": sorted(f for f in versioned if self.has(f))}

    @classmethod
    def from_wire(cls, engine: str, raw: Mapping[str, Any]) -> EngineOptions:
        flags = [str(f) for f in raw.get("flags") or []]
        return cls(engine, str(raw.get("version") or ""), dict.fromkeys(flags), complete=False)

    @classmethod
    def from_probe(cls, raw: Mapping[str, Any]) -> EngineOptions:
        """From probe_options.py's JSON (or a recorded tests/data/engine_help file)."""
        options = {
            name: tuple(spec["choices"]) if spec.get("choices") else None
            for name, spec in raw["options"].items()
        }
        return cls(str(raw["engine"]), str(raw["version"]), options)


def cache_root() -> Path:
    root = os.environ.get("INFERTUNE_CACHE")
    return (Path(root) if root else Path.home() / ".cache/infertune") / "engine_options"


def _version(python: str, engine: str) -> str | None:
    """The engine's installed version, read from its package metadata (no import of the engine)."""
    code = (
        "import importlib.metadata as m, sys\n"
        f"for d in ({engine!r}, {engine + '-cpu'!r}):\n"
        "    try:\n        print(m.version(d)); sys.exit(0)\n"
        "    except m.PackageNotFoundError:\n        pass\nsys.exit(1)"
    )
    try:
        run = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.strip() or None if run.returncode == 0 else None


@functools.lru_cache(maxsize=16)
def learn(python: str, engine: str) -> EngineOptions | None:
    """The options of `engine` installed for `python` (None when it cannot be read there).

    Cached on disk by interpreter path and version: the parser is imported once per image."""
    version = _version(python, engine)
    if version is None:
        return None
    key = hashlib.sha256(f"{python}\0{engine}\0{version}".encode()).hexdigest()[:20]
    path = cache_root() / f"{engine}-{version}-{key}.json"
    if path.exists():
        return EngineOptions.from_probe(json.loads(path.read_text()))
    try:
        run = subprocess.run(
            [python, str(PROBE), engine], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = next((x for x in run.stdout.splitlines() if x.startswith(MARK)), None)
    if run.returncode != 0 or line is None:
        return None
    raw = json.loads(line[len(MARK) :])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(raw, sort_keys=True))
    tmp.replace(path)
    return EngineOptions.from_probe(raw)
