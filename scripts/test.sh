#!/usr/bin/env bash
# Set up (scripts/setup.sh --test) and run the test suite.
#   bash scripts/test.sh            # the default run (what CI runs): every test but the
#                                   # slower duplicates marked `full` (tests/conftest.py)
#   bash scripts/test.sh --full     # everything, the `full` tests included
#   bash scripts/test.sh -m "not slow"   # extra pytest arguments pass through
set -euo pipefail
cd "$(dirname "$0")/.."
select=(-m "not full")
if [ "${1:-}" = "--full" ]; then select=(); shift; fi
bash scripts/setup.sh --test
# the package layering (.importlinter): core numpy-only, rooms layered, no cycles
.venv/bin/lint-imports
exec .venv/bin/python -m pytest -q ${select[@]+"${select[@]}"} "$@"
