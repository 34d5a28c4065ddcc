#!/usr/bin/env bash
# Set up clawmem, create the starter workspace in ./demo, index it and search it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ws=${1:-demo}
.venv/bin/clawmem init "$ws"
.venv/bin/clawmem index --workspace "$ws"
.venv/bin/clawmem search --workspace "$ws" "which staging server do deploys use"
.venv/bin/clawmem status --workspace "$ws"
