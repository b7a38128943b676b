"""The `infertune` command line: one entry point, subcommands imported lazily.

Lazy imports keep `infertune tune` free of kopf and `infertune serve` free of optuna, and keep
start-up fast (the tuner starts an engine server per trial).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module

# subcommand -> (module, function, one-line help). Each function takes argv and returns an exit code.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "validate": (
        "infertune.cli.validate",
        "validate_main",
        "check manifests/specs, print every error",
    ),
    "crds": ("infertune.cli.validate", "crds_main", "write the CRD generated from the API models"),
    "tune": ("infertune.tuner.cli", "tune_main", "profile a model and search serving configs"),
    "bench": ("infertune.tuner.loadgen.cli", "bench_main", "load-test an OpenAI-compatible server"),
    "serve": ("infertune.engine.cli", "serve_main", "run the built-in serving engine"),
    "make-model": ("infertune.engine.cli", "make_model_main", "write a random-weight checkpoint"),
    "gguf": (
        "infertune.tuner.engines.gguf_cli",
        "gguf_main",
        "convert a checkpoint to GGUF for llama.cpp",
    ),
    "fetch-model": (
        "infertune.tuner.fetch_cli",
        "fetch_model_main",
        "fetch hf:// models into the model cache (pods' init step)",
    ),
    "operator": ("infertune.operator.main", "operator_main", "run the Kubernetes operator (kopf)"),
}


def _usage() -> str:
    lines = ["usage: infertune COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<11} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "Run `infertune COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"infertune: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    try:
        entry: Callable[[list[str]], int] = getattr(import_module(module), func)
    except (ImportError, AttributeError) as exc:
        print(f"infertune {name}: not available in this installation ({exc})", file=sys.stderr)
        return 2
    return entry(rest)


if __name__ == "__main__":
    sys.exit(main())
