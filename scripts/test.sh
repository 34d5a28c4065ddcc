#!/usr/bin/env bash
# Set up .venv with the test extras and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
CLAWMEM_EXTRAS=test bash scripts/setup.sh
exec .venv/bin/python -m pytest -n 2 -p no:cacheprovider "$@"
