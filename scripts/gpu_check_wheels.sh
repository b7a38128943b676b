#!/usr/bin/env bash
# Wheels that scripts/gpu_check.sh installs on a GPU machine with no network: what the tuner needs
# beyond what such a machine has (torch, numpy, tokenizers, safetensors, pyyaml, aiohttp,
# prometheus-client, nvidia-ml-py, tqdm, markupsafe, typing-extensions are there). The versions
# are this checkout's virtualenv's; the platform is the borrowed machine's (CPython 3.12, x86-64
# manylinux). Run it here, where pip reaches PyPI, then carry the folder along with the run:
#
#   scripts/gpu_check_wheels.sh            # -> .whl/ (git-ignored)
#   # device run: carry [".whl"], command: scripts/gpu_check.sh
#
# Usage: scripts/gpu_check_wheels.sh [DIR] (default .whl); PYTHON_VERSION=3.11 for another target.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.whl}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
TARGET="${PYTHON_VERSION:-3.12}"
# optuna and its own needs; pydantic and its own; greenlet for SQLAlchemy on x86-64.
NAMES=(optuna alembic sqlalchemy greenlet colorlog mako pydantic pydantic-core annotated-types
       typing-inspection)
mkdir -p "$DEST"
specs=()
for name in "${NAMES[@]}"; do
  version="$("$PY" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: print("")' "$name")"
  specs+=("${name}${version:+==$version}")
done
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
for spec in "${specs[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET" \
    --implementation cp "${platforms[@]}" -d "$DEST" "$spec"
done
ls -1 "$DEST"
du -sh "$DEST"
