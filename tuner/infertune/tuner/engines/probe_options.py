"""Print the options an engine's own argument parser accepts, as JSON (run in the engine's Python).

Standalone on purpose: the tuner runs this file by path in the engine's interpreter (vLLM and
SGLang live in their own venvs), so it imports nothing from infertune. Usage::

    <engine python> probe_options.py vllm|sglang

Output: one line, ``INFERTUNE_OPTIONS `` then ``{"engine", "version", "options": {"--flag": {"takes_value", "nargs", "choices",
"default"}}}``. vLLM's server parser (engine and front-end arguments) comes from
``make_arg_parser``; SGLang's from ``ServerArgs.add_cli_args``. With
``INFERTUNE_PROBE_FORCE_CPU=1`` vLLM's platform is forced to CPU, so a GPU build's parser can be
read on a machine without a GPU (``scripts/record_engine_help.py`` does this).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

MARK = "INFERTUNE_OPTIONS "


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def dump(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    options: dict[str, dict[str, Any]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        takes_value = action.nargs != 0
        choices = sorted({str(c) for c in action.choices}) if action.choices else None
        for name in action.option_strings:
            options[name] = {
                "takes_value": takes_value,
                "nargs": _plain(action.nargs),
                "choices": choices,
                "default": _plain(action.default),
            }
    return dict(sorted(options.items()))


def _first(*paths: str) -> Any:
    for path in paths:
        module, _, attr = path.rpartition(".")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"none of {paths} imports")


def vllm_parser() -> tuple[str, argparse.ArgumentParser]:
    if os.environ.get("INFERTUNE_PROBE_FORCE_CPU"):
        import vllm.platforms as platforms  # type: ignore[import-not-found]

        platforms.builtin_platform_plugins["cpu"] = lambda: "vllm.platforms.cpu.CpuPlatform"
    import vllm  # type: ignore[import-not-found]

    parser_cls = _first(
        "vllm.utils.argparse_utils.FlexibleArgumentParser", "vllm.utils.FlexibleArgumentParser"
    )
    parser = parser_cls()
    try:
        make = _first(
            "vllm.entrypoints.openai.cli_args.make_arg_parser",
            "vllm.entrypoints.launchers.cli_args.make_arg_parser",
        )
        parser = make(parser)
    except ImportError:  # the engine's arguments alone
        from vllm.engine.arg_utils import EngineArgs  # type: ignore[import-not-found]

        EngineArgs.add_cli_args(parser)
    return str(vllm.__version__), parser


def sglang_parser() -> tuple[str, argparse.ArgumentParser]:
    from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

    try:
        from sglang.version import __version__ as version  # type: ignore[import-not-found]
    except ImportError:
        import sglang  # type: ignore[import-not-found]

        version = getattr(sglang, "__version__", "unknown")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return str(version), parser


def main(argv: list[str]) -> int:
    # Run by path, this file's folder comes first on sys.path, and it holds infertune's own
    # vllm.py and sglang.py: drop it so the engine's packages import.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    engine = argv[1] if len(argv) > 1 else ""
    probes = {"vllm": vllm_parser, "sglang": sglang_parser}
    if engine not in probes:
        print(f"usage: probe_options.py {'|'.join(probes)}", file=sys.stderr)
        return 2
    version, parser = probes[engine]()
    out = {"engine": engine, "version": version, "options": dump(parser)}
    # One marked line: an engine may log to stdout while its modules import.
    sys.stdout.write(MARK + json.dumps(out, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
