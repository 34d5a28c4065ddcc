#!/usr/bin/env bash
# The shared index (PostgreSQL + pgvector) end to end: set up .venv with the test extras (they bring a
# bundled PostgreSQL), start it, run two daemons on two workspaces into it, and search across both.
set -euo pipefail
cd "$(dirname "$0")/.."
CLAWMEM_EXTRAS=test bash scripts/setup.sh
exec .venv/bin/python scripts/shared_demo.py "$@"
