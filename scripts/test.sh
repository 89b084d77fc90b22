#!/usr/bin/env bash
# Install everything (scripts/setup.sh), make sure Redis answers, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/ensure-redis.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
