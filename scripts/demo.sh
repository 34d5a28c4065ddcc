#!/usr/bin/env bash
# Set up clawmem, create the starter workspace in ./demo (or $1), index it with the embedded
# local model (no API key), show a search, then serve it on its socket until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ws=${1:-demo}
clawmem=.venv/bin/clawmem
"$clawmem" init "$ws"
"$clawmem" index --workspace "$ws"
"$clawmem" search --workspace "$ws" "which staging server do deploys use"
echo
echo "Serving $ws. In another terminal:"
echo "  .venv/bin/clawmem search --workspace $ws \"why did we pick sqlite\""
echo "  .venv/bin/clawmem status --workspace $ws"
echo "Edit $ws/MEMORY.md or add $ws/memory/$(date +%F).md: it is searchable within seconds."
exec "$clawmem" serve --workspace "$ws"
