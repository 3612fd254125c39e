#!/usr/bin/env bash
# Set up (scripts/setup.sh --test) and run the whole test suite.
#   bash scripts/test.sh            # everything, the real-model tests included
#   bash scripts/test.sh -m "not slow"   # extra pytest arguments pass through
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
# the package layering (.importlinter): core numpy-only, no backend in apps, no cycles
.venv/bin/lint-imports
exec .venv/bin/python -m pytest -q "$@"
