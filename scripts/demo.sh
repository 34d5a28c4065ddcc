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
query="which staging server do deploys use"
echo "\$ $clawmem search --workspace $ws \"$query\""
"$clawmem" search --workspace "$ws" "$query"
echo
try() {
  echo "  $clawmem search --workspace $ws \"why did we pick sqlite\""
  echo "  $clawmem status --workspace $ws"
  echo "Edit $ws/MEMORY.md or add $ws/memory/$(date +%F).md: it is searchable within seconds."
}
# A daemon already serving the workspace (an earlier demo, a systemd instance) answered the search above.
if "$clawmem" status --workspace "$ws" --json 2>/dev/null \
    | .venv/bin/python -c 'import json, sys; sys.exit(0 if json.load(sys.stdin).get("daemon") else 1)'; then
  echo "A clawmem daemon already serves $ws (it answered the search above); not starting another. Try:"
  try
  exit 0
fi
echo "Serving $ws. In another terminal:"
try
exec "$clawmem" serve --workspace "$ws"
