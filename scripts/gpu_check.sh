#!/usr/bin/env bash
# The GPU check of issue 19 (point 6): the built-in engine on CUDA in every precision with CUDA
# graphs on and off (greedy equality, tok/s, graph speed-up), the profiler's ceilings against the
# GPU's datasheet, and a 6-trial builtin study, ending in compact tables. Under 8 minutes on one
# H100/H200 with no network. `--dry-run` takes the same code paths on the CPU with tiny sizes and
# says which CUDA-only steps it skips (a unit test runs it: tests/unit/tuner/test_gpu_check.py).
#
# On a machine with torch but without optuna/pydantic (the borrowed GPU machine), it installs the
# wheels that scripts/gpu_check_wheels.sh downloaded (.whl/, or $INFERTUNE_WHEELS) into a private
# folder first. It runs the source tree (PYTHONPATH), no install needed.
#
# Usage: scripts/gpu_check.sh [--dry-run] [--out DIR] [--size tiny|small|medium]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"
else PY=python3
fi
WHEELS="${INFERTUNE_WHEELS:-$ROOT/.whl}"
if ! "$PY" -c "import optuna, pydantic" >/dev/null 2>&1; then
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    SITE="${TMPDIR:-/tmp}/infertune-gpu-check-site"
    echo "installing $(ls "$WHEELS"/*.whl | wc -l) carried wheels from $WHEELS into $SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "optuna/pydantic are missing and $WHEELS has no wheels: run scripts/gpu_check_wheels.sh" >&2
    exit 2
  fi
fi
# `infertune` is one namespace package over two source roots (pyproject.toml's package-dir).
export PYTHONPATH="$ROOT/operator:$ROOT/tuner${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec timeout "${GPU_CHECK_TIMEOUT_S:-480}" "$PY" "$ROOT/scripts/gpu_check.py" "$@"
