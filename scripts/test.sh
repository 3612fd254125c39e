#!/usr/bin/env bash
# Set up (scripts/setup.sh --test) and run the test suite.
#   bash scripts/test.sh            # the default run (what CI runs): every test but the
#                                   # slower duplicates marked `full` (tests/conftest.py)
#   bash scripts/test.sh --full     # everything, the `full` tests included
#   bash scripts/test.sh --sanitize # the compiled kernels built with AddressSanitizer and
#                                   # UBSan, their tests (tests/backends/cuda/cpu and the
#                                   # compiled ReDrafter step's) run
#                                   # under them; any finding fails the run
#                                   # (a clean run records the kernels' hash in
#                                   # .ci/sanitized.sha256; CI sanitizes when it differs)
#   bash scripts/test.sh --kernel-hash  # print that hash
#   bash scripts/test.sh -m "not slow"   # extra pytest arguments pass through (then one
#                                        # pytest process, every test at the machine's threads)
# The default and --full runs use two pytest-xdist workers at one thread each (the suite is
# mostly Python: 28 -> 17 min on a 2-core Zen 3), then the tests marked `serial` (they need
# the machine's threads) alone. Two jobs of two threads each on two cores would slow each
# other 5-40x (OpenMP threads waiting on a preempted one); one thread each does not.
# DRAFTWISE_TEST_WORKERS=1: everything in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
kernel_hash() {  # the C sources and the Python that calls into them (C collation: stable)
  (LC_ALL=C; cat draftwise/backends/cuda/cpu/csrc/* draftwise/backends/cuda/cpu/*.py \
    draftwise/backends/cuda/redrafter/native.py) | sha256sum | cut -d' ' -f1
}
mode=default
case "${1:-}" in
  --full) mode=full; shift ;;
  --sanitize) mode=sanitize; shift ;;
  --kernel-hash) kernel_hash; exit 0 ;;
esac
bash scripts/setup.sh --test
if [ "$mode" = sanitize ]; then
  cc=${CC:-gcc}
  preload="$("$cc" -print-file-name=libasan.so) $("$cc" -print-file-name=libubsan.so)"
  export DRAFTWISE_SANITIZE=1 LD_PRELOAD="$preload"
  export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:symbolize=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # the instrumented build must exist: a silent fallback to torch would test nothing
  .venv/bin/python -c "from draftwise.backends.cuda.cpu import native
assert native.attention_lib() is not None, 'the sanitizer build of the kernels failed'
print('sanitizer build:', ' '.join(native.build_flags()))"
  .venv/bin/python -m pytest -q -p no:cacheprovider -m "not full" tests/backends/cuda/cpu \
    tests/backends/cuda/redrafter/test_redrafter_native.py "$@"
  [ $# -eq 0 ] && kernel_hash > .ci/sanitized.sha256  # the whole kernel run passed
  exit 0
fi
# the package layering (.importlinter): core numpy-only, rooms layered, no cycles
.venv/bin/lint-imports
run_pytest() { .venv/bin/python -m pytest -q -p no:cacheprovider --durations=40 "$@"; }
full_only="not full"
[ "$mode" = full ] && full_only="full or not full"
workers=${DRAFTWISE_TEST_WORKERS:-2}
if [ $# -gt 0 ] || [ "$workers" -le 1 ] || ! .venv/bin/python -c "import xdist" 2>/dev/null; then
  exec .venv/bin/python -m pytest -q --durations=40 -m "$full_only" "$@"
fi
# loadfile: a module's tests (and its module fixtures: a server, a converted model) on one
# worker; each worker has its own test cache directory (tests/conftest.py)
OMP_NUM_THREADS=1 run_pytest -n "$workers" --dist loadfile -m "($full_only) and not serial"
echo "test: the tests marked serial, alone at the machine's threads"
run_pytest -m "($full_only) and serial"
