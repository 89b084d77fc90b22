#!/usr/bin/env bash
# Install everything (scripts/setup.sh), make sure Redis answers, run the whole test suite.
# pytest-xdist runs a worker per core (CI: 2; one more than that was slower and made the browser
# tests flaky), each test file on one worker so its module fixtures are built once and its tests
# run in order, the slowest files first (tests/conftest.py's SLOW_FILES_FIRST; xdist's own
# reordering by test count would put them last); each worker's torch gets one thread, so the
# workers do not fight over the cores. Arguments go to pytest: `bash scripts/test.sh tests/test_train.py -n 0` runs
# one file in this process. --durations=30: CI's log names the slowest tests, so the 15-minute budget can be kept.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/ensure-redis.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder --durations=30 "$@"
